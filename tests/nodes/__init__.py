"""Log servers as real processes: the peer transport and its codec, kills, power loss, a full disk,
bad client requests, connection limits, snapshots and membership changes live."""
