"""The command lines: dledger, dledger up and node control, NameServer lists, logging."""
