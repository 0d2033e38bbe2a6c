"""Benchmark tools: the peers (pysyncobj, NATS) and our own workloads, measured side by side."""
