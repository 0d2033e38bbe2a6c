"""A node's storage: the commitlog (segments of checksummed entries and their index files, its
recovery, writes and group commit), the hard-state file, the fsync machinery (``aiofsync``,
``flush``), retention's rules, the seams they implement (``seams``: ``LogStore`` and
``HardStateStore``) and the in-memory stores the tests and the simulator use (``memstore``)."""

__all__: list[str] = []
