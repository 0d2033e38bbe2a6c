"""The broker's core state machine, pure and deterministic: its log entries and their codec,
consume queues (in memory or in files), the dedup table, the apply results, consumer-group
membership, and the request table with its field checks."""

__all__: list[str] = []
