"""Snapshots in a node (Raft section 7): the seam an application fills (``provider``), the
node's part (``shell``), a transfer's two sides (``send``, ``receive``) and their frames
(``wire``), and a snapshot's files on disk, installed crash-safely (``files``)."""

__all__: list[str] = []
