"""Chaos and verification: the deterministic simulator (sim/), later the fault proxy and live scenarios."""
