"""The NameServer and its web console."""
