"""The client library: producers, consumers, leader tracking, types and rebalancing."""
