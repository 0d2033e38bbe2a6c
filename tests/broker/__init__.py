"""The broker's state machine, requests, send path, checkpoints (and old ones: data/), queries and
filters, metrics, and broker groups as real processes."""
