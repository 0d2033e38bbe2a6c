"""Every benchmark: the peers (pysyncobj, NATS, RocketMQ's own clients) and our workloads,
measured side by side in one run (tools that print figures, never timed assertions in tests).

- ``python -m bench.log``: the replicated log against pysyncobj (``log``, with ``disk``,
  ``load``, ``nodeflags``, ``pysyncobj_peer`` and ``pysyncobj_node``);
- ``dledger bench``: the broker against NATS JetStream (``broker``), with ``--grpc`` the
  official RocketMQ 5 client (``grpc``), with ``--remoting`` the RocketMQ 4.x C++ client
  (``remoting``, its side ``remoting_driver`` in the clients' environment) and ``--failover``
  (``failover``);
- ``python -m bench.flags``, ``bench.growth``, ``bench.delay``, ``bench.index``: node defaults,
  what a backlog, pending timers and the key index cost.

No runtime module imports this package (tests/test_layers.py); ``dledger bench`` loads it when
it runs.
"""

__all__: list[str] = []
