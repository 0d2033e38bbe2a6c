"""Benchmark tools for the broker's storage on its own (no cluster): what its files cost."""
