"""Asking a live consumer on its own connection (RocketMQ's 307 GET_CONSUMER_RUNNING_INFO and
309 CONSUME_MESSAGE_DIRECTLY): the consumer connections a node knows (``service``) and the
CONSUMER_RUNNING_INFO / CONSUME_DIRECTLY handlers."""

__all__: list[str] = []
