"""Queue locks for orderly consumers: the lock table (``model``) and the leader's lock and
unlock requests (``service``)."""

__all__: list[str] = []
