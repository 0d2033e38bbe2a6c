"""The wire, shared by every process and library of the cluster: the bottom layer.

Frames and their envelope (``frames``), the request and response envelope and the log server's
kinds (``envelope``), the broker's request kinds and result codes (``broker_kinds``), the named
errors a caller can see (``errors``, ``broker_errors``), signed requests (``auth``), TLS
settings (``tls``), HTTP/1.1 heads for the broker's own admin server and registrar
(``http1``), the rules a client and a broker must agree on (``topics``, ``filter_sql``,
``consume_rules``, ``namesrv_addrs``), and the asyncio connection that carries frames
(``framed``) with its client side (``group_client``: requests to one node or to a group's
leader). It imports nothing of the log, the broker or the client library; they all import it.
"""

__all__: list[str] = []
