"""Storage (the commitlog, entry codec, hard state, fsync, retention, snapshot files) and the node
runtime, over files and over the in-memory seams."""
