"""The broker: topics, queues, consume queues, offsets and the messaging features, as a
deterministic state machine applied to committed entries of the replicated log (``dledger``),
served to clients by front ends over one in-process API.

Layers, bottom to top: ``core`` (the state machine's core, the entry registry, the request
table), ``features`` (each feature's model, entries, apply, service and handlers), ``machine``
(the state machine assembled), ``api`` (the in-process broker API), ``frontends`` (our protocol
and RocketMQ 5's gRPC), ``shell`` (checkpoints, admin HTTP, metrics, registration), and the node
itself (``config``, ``server``). docs/design.md says more.
"""

__all__: list[str] = []
