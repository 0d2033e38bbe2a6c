"""The messaging features run beside a live chaos scenario (``driver``), through the real client
library (``clients``; transactions: ``txn`` and its killable producer process, ``txn_producer``)."""

__all__: list[str] = []
