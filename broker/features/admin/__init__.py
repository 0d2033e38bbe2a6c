"""Consumer-group administration: offset resets through the log, a group's status, and the
state digest replicas compare."""

__all__: list[str] = []
