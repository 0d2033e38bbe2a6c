"""The transport seam of a node: what ``dledger.node.runtime.Node`` uses of its peer transport, as
a protocol (``Transport``), and the callbacks a transport delivers to.

Owns only the contract. The TCP implementation is ``dledger.network.transport.PeerTransport``
(a node builds one from its configuration unless it is given a transport); the in-process one,
for tests, is ``dledger.network.memory.MemoryTransport``.

Contract:
- ``attach(on_message, ...)`` once, before ``start``: where messages go. A transport calls
  ``on_message`` with each message addressed to its node, from the event loop (never from inside
  ``send``), and then ``on_batch_end`` once for the messages it delivered together, so that the
  node steps them as one batch.
- ``start()`` once: the address peers reach this node at; ``stop()`` is idempotent and drops
  what is queued (Raft tolerates message loss).
- ``send(msg)`` never blocks nor awaits (it runs on the node's hot path) and never raises for a
  peer that is down: it returns False when the message was dropped (unknown or unreachable peer,
  a full queue), and the drop is counted in ``stats()``.
- ``set_dial(peer, addr)``: reach ``peer`` at ``addr`` from now on (the membership in force).
- ``stats()``: counters per peer id (and ``"?"`` for what no known peer owns).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from dledger.network.peer_stream import PeerStream
from dledger.raft.types import Message

__all__ = ["Address", "OnMessage", "OnStream", "Resolve", "Transport"]

Address = tuple[str, int]
OnMessage = Callable[[Message], None]
OnStream = Callable[[PeerStream], None]
# Where to reach a peer that reached this node and that it has no link to, given where that peer
# says it listens (None: not at all); see ``PeerTransport.learn_address``.
Resolve = Callable[[str, Address], Address | None]


class Transport(Protocol):
    """The links of one node to the other members of its group (see the module docstring)."""

    def attach(self, on_message: OnMessage, *, on_batch_end: Callable[[], None] | None = None,
               on_stream: OnStream | None = None, resolve: Resolve | None = None) -> None: ...

    async def start(self) -> Address: ...

    async def stop(self) -> None: ...

    def send(self, msg: Message) -> bool: ...

    def set_dial(self, peer: str, addr: Address) -> None: ...

    def stats(self) -> dict[str, dict[str, int]]: ...
