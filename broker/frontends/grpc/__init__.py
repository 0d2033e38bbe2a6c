"""RocketMQ 5's gRPC ``MessagingService`` (``gateway``: the server; ``codec``: the protocol's
messages and codes; ``sends``, ``consume``, ``txn``: the calls by what they do)."""

__all__: list[str] = []
