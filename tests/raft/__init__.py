"""The Raft core scenario by scenario (named after the paper's claims), the deterministic simulator
and the nodes' event traces."""
