"""Transactional messages: half messages and the table of open transactions (``model``), their
apply, the leader's service (end, check-back), producer groups and the handlers."""

__all__: list[str] = []
