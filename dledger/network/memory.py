"""An in-process network (``MemoryNetwork``) and the transports on it (``MemoryTransport``, a
``dledger.network.seams.Transport``): the nodes of one group in one event loop, linked without
sockets, for tests that run real nodes.

A transport listens at an address of its network (``start``; port 0 picks a free one) and
reaches a peer at the address it dials for it (``set_dial``, or ``dial`` when made), as
``PeerTransport`` does over TCP; a message from a peer it has no address for teaches it one
(through the node's ``resolve``, as a Hello does). Each message is encoded and decoded with the
peer codec (``dledger.network.wire``), as on the wire, and delivered asynchronously: it waits in
the receiver's bounded queue, and one callback scheduled on the event loop (``call_soon``) hands
what is queued to the receiver's ``on_message`` and then calls its ``on_batch_end`` once, as one
socket read does. Between one sender and one receiver, messages arrive in the order sent.

A message is dropped and counted (in the sender's ``stats()``, and in the network's ``dropped``)
when its peer has no address, when no started transport listens there, when the receiver's
queue is full, or when it is still queued as the receiver stops; one from another group, or
misrouted, is dropped and counted as an error by the receiver. Owns the addresses, the queues
and the counters: no sleeps, no threads, no sockets, no files.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
from collections import deque
from collections.abc import Callable, Mapping

from dledger.network.seams import Address, OnMessage, OnStream, Resolve
from dledger.network.wire import Hello, SnapshotHello, decode_message, encode_message
from dledger.raft.types import Message
from protocol.errors import WireError

__all__ = ["UNATTRIBUTED", "MemoryNetwork", "MemoryTransport"]

UNATTRIBUTED = "?"  # stats() key for what no known peer owns (as PeerTransport's)


@dataclasses.dataclass(slots=True)
class _Counts:
    sent: int = 0  # messages handed to a receiver's queue
    dropped: int = 0  # messages dropped on the way out (see the module docstring)
    received: int = 0  # messages delivered to on_message
    bytes: int = 0  # encoded bytes sent
    bytes_received: int = 0
    errors: int = 0  # messages refused on arrival: another group, misrouted, undecodable


class MemoryNetwork:
    """The addresses and queues of one group's in-memory transports (one event loop).

    ``queue_max`` bounds each receiver's queue of undelivered messages; ``batch_max`` bounds
    how many one delivery callback hands over before it yields to the loop."""

    def __init__(self, *, queue_max: int = 4096, batch_max: int = 512) -> None:
        if queue_max < 1 or batch_max < 1:
            raise ValueError("queue_max and batch_max must be at least 1")
        self.queue_max = queue_max
        self.batch_max = batch_max
        self.dropped = 0  # messages that reached no node's on_message, whatever the cause
        self.delivered = 0
        self._at: dict[Address, MemoryTransport] = {}
        self._next_port = 1

    def transport(self, node_id: str, group: str, listen: Address,
                  dial: Mapping[str, Address] | None = None) -> MemoryTransport:
        """A transport for ``node_id`` that will listen at ``listen`` once started."""
        return MemoryTransport(self, node_id, group, listen, dial or {})

    def listener(self, addr: Address) -> MemoryTransport | None:
        """The started transport listening at ``addr``, if any."""
        return self._at.get(addr)

    def _listen(self, transport: MemoryTransport, addr: Address) -> Address:
        host, port = addr
        if port == 0:
            while (host, self._next_port) in self._at:
                self._next_port += 1
            addr = (host, self._next_port)
        if addr in self._at:
            raise OSError(errno.EADDRINUSE, f"{addr[0]}:{addr[1]} is in use on this network")
        self._at[addr] = transport
        return addr

    def _unlisten(self, transport: MemoryTransport, addr: Address) -> None:
        if self._at.get(addr) is transport:
            del self._at[addr]


class MemoryTransport:
    """One node's links on a ``MemoryNetwork`` (see the module docstring). Started once."""

    def __init__(self, network: MemoryNetwork, node_id: str, group: str, listen: Address,
                 dial: Mapping[str, Address]) -> None:
        self.node_id = node_id
        self.group = group
        self.address: Address | None = None  # where it listens, once started
        self._network = network
        self._listen = listen
        self._dial = {peer: addr for peer, addr in dial.items() if peer != node_id}
        self._counts: dict[str, _Counts] = {UNATTRIBUTED: _Counts()}
        self._queue: deque[tuple[MemoryTransport, bytes]] = deque()
        self._scheduled = False  # a delivery callback is on the loop
        self._on_message: OnMessage | None = None
        self._on_batch_end: Callable[[], None] | None = None
        self._resolve: Resolve | None = None
        self._started = False
        self._stopped = False

    # -- lifecycle -------------------------------------------------------------------------------

    def attach(self, on_message: OnMessage, *, on_batch_end: Callable[[], None] | None = None,
               on_stream: OnStream | None = None, resolve: Resolve | None = None) -> None:
        """Where messages go. No stream ever opens here: ``on_stream`` is not called (snapshot
        streams need the TCP transport)."""
        if self._started:
            raise RuntimeError("MemoryTransport.attach() must come before start()")
        self._on_message, self._on_batch_end, self._resolve = on_message, on_batch_end, resolve

    async def start(self) -> Address:
        if self._started or self._stopped:
            raise RuntimeError("MemoryTransport.start() may be called once, before stop()")
        if self._on_message is None:
            raise RuntimeError("MemoryTransport.start() needs attach() first")
        self.address = self._network._listen(self, self._listen)
        self._started = True
        return self.address

    async def stop(self) -> None:
        """Stop listening; what is queued for this node is dropped. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self.address is not None:
            self._network._unlisten(self, self.address)
        self._network.dropped += len(self._queue)
        self._queue.clear()

    # -- sending ---------------------------------------------------------------------------------

    def send(self, msg: Message) -> bool:
        """Queue ``msg`` at its peer's transport; False (and counted) if dropped. Never blocks."""
        addr = self._dial.get(msg.dst)
        counts = self._counts_of(msg.dst) if addr is not None else self._counts[UNATTRIBUTED]
        to = self._network.listener(addr) if addr is not None else None
        if to is None or not self._started or self._stopped:
            return self._drop(counts)
        payload = encode_message(msg)
        if not to._accept(self, payload):
            return self._drop(counts)
        counts.sent += 1
        counts.bytes += len(payload)
        return True

    def _drop(self, counts: _Counts) -> bool:
        counts.dropped += 1
        self._network.dropped += 1
        return False

    def set_dial(self, peer: str, addr: Address) -> None:
        if peer != self.node_id:
            self._dial[peer] = addr

    def dial_address(self, peer: str) -> Address | None:
        return self._dial.get(peer)

    # -- receiving -------------------------------------------------------------------------------

    def _accept(self, sender: MemoryTransport, payload: bytes) -> bool:
        """Queue one message from ``sender`` and make sure a delivery is scheduled; False if
        this transport cannot take it (not listening, or its queue is full)."""
        if not self._started or self._stopped or len(self._queue) >= self._network.queue_max:
            return False
        self._queue.append((sender, payload))
        self._schedule()
        return True

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._deliver)

    def _deliver(self) -> None:
        """Hand what is queued (at most ``batch_max``) to on_message, then call on_batch_end."""
        self._scheduled = False
        on_message = self._on_message
        if self._stopped or on_message is None:
            return
        delivered = 0
        for _ in range(min(len(self._queue), self._network.batch_max)):
            msg = self._take(*self._queue.popleft())
            if msg is not None:
                on_message(msg)
                delivered += 1
        self._network.delivered += delivered
        if delivered and self._on_batch_end is not None:
            self._on_batch_end()
        if self._queue and not self._stopped:
            self._schedule()

    def _take(self, sender: MemoryTransport, payload: bytes) -> Message | None:
        """Decode and check one queued message (None: refused, counted)."""
        if sender.group != self.group:
            self._counts[UNATTRIBUTED].errors += 1
            self._network.dropped += 1
            return None
        counts = self._counts_of(sender.node_id)
        counts.bytes_received += len(payload)
        try:
            msg = decode_message(payload)
        except WireError:
            msg = None
        if msg is None or isinstance(msg, (Hello, SnapshotHello)) \
                or msg.src != sender.node_id or msg.dst != self.node_id:
            counts.errors += 1
            self._network.dropped += 1
            return None
        if sender.node_id not in self._dial and sender.address is not None:
            said = sender.address  # (where it listens: what its Hello would say)
            addr = self._resolve(sender.node_id, said) if self._resolve is not None else said
            if addr is not None:
                self.set_dial(sender.node_id, addr)
        counts.received += 1
        return msg

    # -- observability ---------------------------------------------------------------------------

    def _counts_of(self, peer: str) -> _Counts:
        counts = self._counts.get(peer)
        if counts is None:
            counts = self._counts[peer] = _Counts()
        return counts

    def stats(self) -> dict[str, dict[str, int]]:
        """Counters per peer (plus UNATTRIBUTED), in ``PeerTransport.stats()``'s shape."""
        out: dict[str, dict[str, int]] = {}
        for peer in {*self._counts, *self._dial}:
            row = dataclasses.asdict(self._counts_of(peer))
            addr = self._dial.get(peer)
            row["reconnects"] = 0
            row["pending"] = 0  # (nothing waits for a connection here)
            row["connected"] = int(addr is not None and self._network.listener(addr) is not None)
            out[peer] = row
        return out
