"""Pop consumption (RocketMQ 5's receive, ack and change-invisible-duration): the table of
messages in flight (``model``), its entries and apply, the leader's service and the handlers."""

__all__: list[str] = []
