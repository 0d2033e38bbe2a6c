"""A node's network: the peer transport (one dialed link per peer, accepted links, the
``Transport`` seam it implements: ``seams``), the in-process network tests run real nodes on
(``memory``), the Raft peer codec (``wire``), streams handed over on the peer port
(``peer_stream``), and the test certificate authority of ``dledger up --tls`` (``tls_certs``)."""

__all__: list[str] = []
