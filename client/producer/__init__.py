"""Producing: the producer (``producer``), a batch's size as the broker counts it (``batch``),
the delivery of sends to the groups' leaders with retries (``delivery``), a producer group's
registration for check-backs (``group``), pipelined sends (``pipeline``) and transactions
(``transaction``, and ``txn_batch``: the exactly-once pipeline's transaction)."""

__all__: list[str] = []
