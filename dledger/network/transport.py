"""Peer transport: the asyncio TCP links between the members of one Raft group (a node's own,
unless it is given another ``dledger.network.seams.Transport``).

Owns the sockets of the Raft peer protocol (framing and codec are ``dledger.network.wire``'s):
- one *outbound* connection per peer, dialed by this node at ``dial[peer]``, write-only;
- any number of *inbound* connections accepted on ``listen``, read-only
  (``dledger.network.inbound``; the client port's ``ConnectionLimits`` do not apply here, so
  clients never starve Raft traffic).
Links are directed so that each direction of each pair can be routed through its own fault proxy.
The first frame on a dialed connection is ``Hello(group, node_id, listen)``; the acceptor refuses
another group, and dials back at ``listen`` a peer it has no address for (``learn_address``).
Each peer has a bounded queue of frames waiting for a connection and one dialer task that
reconnects with jittered exponential backoff. With TLS each new connection takes the contexts
current then (a certificate reloaded on SIGHUP is used from the next one on); with
``peer_identity`` (``--peer-mtls``) each end checks that the other's certificate names the node
it is (``dledger.network.peer_identity``).

Must not: block or await in ``send`` (it runs on the node's hot path), grow without bound (the
pending queue and the socket write buffer are capped; overflow is dropped and counted: Raft
tolerates message loss), interpret messages (the runtime does, through ``on_message``), or let a
malformed peer take the listener down (a bad frame closes that one connection).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from dledger.network.inbound import HELLO_BYTES_MAX, UNATTRIBUTED, InboundProtocol
from dledger.network.outbound import Link, OutboundProtocol, PeerStats, address_text
from dledger.network.peer_identity import refusal
from dledger.network.peer_stream import PeerStream
from dledger.network.wire import Hello, encode_message
from dledger.raft.types import Message
from protocol.frames import DEFAULT_MAX_FRAME_BYTES, FRAME_HEADER_BYTES, encode_frame
from protocol.tls import SSLError

if TYPE_CHECKING:
    import ssl

__all__ = ["HELLO_BYTES_MAX", "UNATTRIBUTED", "PeerTransport"]  # (the first two: inbound's)

logger = logging.getLogger(__name__)
_WILDCARD_HOSTS = ("", "0.0.0.0", "::")


class PeerTransport:
    """Directed TCP links to the peers of one Raft group (see the module docstring)."""

    def __init__(
        self,
        node_id: str,
        group: str,
        listen: tuple[str, int],
        dial: dict[str, tuple[str, int]],
        on_message: Callable[[Message], None],
        *,
        rng: random.Random,
        on_batch_end: Callable[[], None] | None = None,
        on_stream: Callable[[PeerStream], None] | None = None,
        resolve: Callable[[str, tuple[str, int]], tuple[str, int] | None] | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        send_buffer_bytes_max: int = 8 * 1024 * 1024,
        pending_frames_max: int = 1024,
        connect_timeout_s: float = 1.0,
        backoff_min_s: float = 0.05,
        backoff_max_s: float = 1.0,
        server_ssl: ssl.SSLContext | None = None,
        dial_ssl: ssl.SSLContext | Callable[[], ssl.SSLContext] | None = None,
        peer_identity: bool = False,
    ) -> None:
        if pending_frames_max < 1 or send_buffer_bytes_max < 1 or connect_timeout_s <= 0:
            raise ValueError("pending_frames_max, send_buffer_bytes_max, connect_timeout_s > 0")
        if not 0 < backoff_min_s <= backoff_max_s:
            raise ValueError("need 0 < backoff_min_s <= backoff_max_s")
        self.node_id = node_id
        self.group = group
        self.on_message = on_message
        # Called after the messages of one read were all handed to on_message (so that the
        # owner can handle them as one batch).
        self.on_batch_end = on_batch_end
        # Called with each inbound connection that opened with SnapshotHello (None: refused).
        self.on_stream = on_stream
        # Whether and where to dial a peer that dialed us and that we have no link to, given
        # where its Hello says it listens (None: not at all); no resolver: there.
        self._resolve = resolve
        self.max_frame_bytes = max_frame_bytes
        self.inbound: set[InboundProtocol] = set()
        self._listen = listen
        self._rng = rng
        self._send_buffer_bytes_max = send_buffer_bytes_max
        self._pending_frames_max = pending_frames_max
        self._connect_timeout_s = connect_timeout_s
        self._backoff_min_s = backoff_min_s
        self._backoff_max_s = backoff_max_s
        # TLS (protocol.tls): the listener's context (requiring a client certificate with mutual
        # TLS) and the dialer's, which checks the peer's certificate against the dialed host: a
        # context, or what gives the current one at each dial (it follows a reload).
        self._server_ssl = server_ssl
        self._dial_ssl = dial_ssl
        # --peer-mtls: each end's certificate must name the node it is (both directions).
        self.peer_identity = peer_identity
        self._hello_frame = encode_frame(encode_message(Hello(group, node_id)))
        self._stats: dict[str, PeerStats] = {UNATTRIBUTED: PeerStats()}
        self._links: dict[str, Link] = {}
        for peer, addr in dial.items():
            if peer != node_id:
                self._add_link(peer, addr)
        self._server: asyncio.Server | None = None
        self.stopped = False

    # --- lifecycle ---------------------------------------------------------------------------

    def attach(self, on_message: Callable[[Message], None], *,
               on_batch_end: Callable[[], None] | None = None,
               on_stream: Callable[[PeerStream], None] | None = None,
               resolve: Callable[[str, tuple[str, int]], tuple[str, int] | None] | None = None
               ) -> None:
        """Deliver to these callbacks instead of the constructor's (before ``start``: a node
        given this transport attaches itself; ``dledger.network.seams.Transport``)."""
        if self._server is not None:
            raise RuntimeError("PeerTransport.attach() must come before start()")
        self.on_message, self.on_batch_end = on_message, on_batch_end
        self.on_stream, self._resolve = on_stream, resolve

    async def start(self) -> tuple[str, int]:
        """Listen, start one dialer per peer; return the actual listen address (port 0 ok)."""
        if self._server is not None or self.stopped:
            raise RuntimeError("PeerTransport.start() may be called once, before stop()")
        loop = asyncio.get_running_loop()
        host, port = self._listen
        self._server = await loop.create_server(lambda: InboundProtocol(self), host, port,
                                                ssl=self._server_ssl)
        for link in self._links.values():
            self._start_dialer(link)
        sockname = self._server.sockets[0].getsockname()
        self._hello_frame = encode_frame(encode_message(
            Hello(self.group, self.node_id, address_text(sockname[0], sockname[1]))))
        return sockname[0], sockname[1]

    async def stop(self) -> None:
        """Close the listener and every connection, cancel the dialers. Idempotent.

        Frames still in a socket's write buffer are discarded (Raft tolerates the loss).
        """
        if self.stopped:
            return
        self.stopped = True
        if self._server is not None:
            self._server.close()
        tasks = [link.task for link in self._links.values() if link.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        closing: list[asyncio.Future[None]] = []
        for link in self._links.values():
            link.pending.clear()
            if link.protocol is not None:
                link.protocol.abort()
                closing.append(link.protocol.closed)
            link.transport = None
        for inbound in list(self.inbound):
            inbound.close()
            closing.append(inbound.closed)
        if self._server is not None:
            await self._server.wait_closed()
        await asyncio.gather(*closing)  # abort() calls connection_lost on the next loop pass

    # --- sending (hot path) ------------------------------------------------------------------

    def send(self, msg: Message) -> bool:
        """Write ``msg`` to ``msg.dst`` now, or queue it until connected. Never blocks.

        Returns False when the message was dropped (unknown dst, write buffer full, stopped,
        frame too large); True when written or queued. A full queue drops its oldest frame.
        """
        link = self._links.get(msg.dst)
        if link is None or self.stopped:
            (link.stats if link is not None else self._stats[UNATTRIBUTED]).dropped += 1
            return False
        frame = encode_frame(encode_message(msg))
        if len(frame) - FRAME_HEADER_BYTES > self.max_frame_bytes:
            link.stats.dropped += 1
            link.stats.errors += 1
            logger.error("dropping %s to %s: %d-byte frame exceeds max_frame_bytes",
                         type(msg).__name__, msg.dst, len(frame))
            return False
        transport = link.transport
        if transport is None or transport.is_closing():  # closing: connection_lost is pending
            pending = link.pending
            if len(pending) == pending.maxlen:
                link.stats.dropped += 1  # the append below evicts the oldest frame
            pending.append(frame)
            return True
        return self._write(link, transport, frame)

    def _write(self, link: Link, transport: asyncio.Transport, frame: bytes) -> bool:
        if transport.get_write_buffer_size() >= self._send_buffer_bytes_max:
            link.stats.dropped += 1
            return False
        transport.write(frame)
        link.stats.sent += 1
        link.stats.bytes += len(frame)
        return True

    # --- dialing -----------------------------------------------------------------------------

    def set_dial(self, peer: str, addr: tuple[str, int]) -> None:
        """Dial ``peer`` at ``addr`` from now on (reconnecting if connected elsewhere)."""
        if peer == self.node_id:
            return
        link = self._links.get(peer)
        if link is None:
            link = self._add_link(peer, addr)
        elif link.addr == addr:
            return
        link.addr = addr
        if self._server is None or self.stopped:
            return  # start() will dial the new address
        if link.task is not None:
            link.task.cancel()
        if link.protocol is not None:
            link.protocol.abort()
        link.transport = None
        self._start_dialer(link)

    def dial_address(self, peer: str) -> tuple[str, int] | None:
        """Where ``peer`` is dialed (None: it is not)."""
        link = self._links.get(peer)
        return link.addr if link is not None else None

    def learn_address(self, peer: str, listen: str, source: str) -> None:
        """``peer`` said in its Hello that it listens at ``listen`` (a wildcard host meaning the
        host the connection came from, ``source``): if this node has no link to it, dial it
        there, or where the owner's ``resolve`` says (or not at all, if it says None). A link
        that exists is never moved."""
        if peer in self._links or peer == self.node_id:
            return
        host, sep, port = listen.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            logger.warning("ignoring %s's listen address %r: not host:port", peer, listen)
            return
        host = host.strip("[]")
        if host in _WILDCARD_HOSTS:
            host = source.rpartition(":")[0].strip("[]")
            if not host:
                return
        said = (host, int(port))
        addr = self._resolve(peer, said) if self._resolve is not None else said
        if addr is not None:
            logger.info("dialing %s at %s:%s (its Hello said %s:%s)", peer, *addr, host, port)
            self.set_dial(peer, addr)

    def _add_link(self, peer: str, addr: tuple[str, int]) -> Link:
        link = Link(peer, addr, self._pending_frames_max)
        link.stats = self.stats_of(peer)
        self._links[peer] = link
        return link

    def _start_dialer(self, link: Link) -> None:
        link.task = asyncio.get_running_loop().create_task(
            self._dial_forever(link), name=f"dledger-dial-{self.node_id}->{link.peer}"
        )
        link.task.add_done_callback(self._on_dialer_done)

    def _on_dialer_done(self, task: asyncio.Task[None]) -> None:
        # A dialer only ends by cancellation; anything else is a bug that leaves the link down.
        if not task.cancelled() and task.exception() is not None:
            logger.error("%s: dialer %s died; its link stays down", self.node_id,
                         task.get_name(), exc_info=task.exception())

    async def _dial_forever(self, link: Link) -> None:
        failures = 0
        while True:
            protocol = await self._connect(link)
            if protocol is None:
                failures += 1
            else:
                failures = 1  # connected: the backoff starts over after this disconnect
                # shield: cancelling this task must not cancel the future stop() waits on
                await asyncio.shield(protocol.closed)
            await asyncio.sleep(self._backoff_s(failures))

    async def _connect(self, link: Link) -> OutboundProtocol | None:
        """One connection attempt; on success the link is live (Hello sent, queue flushed)."""
        loop = asyncio.get_running_loop()
        host, port = link.addr
        dial_ssl = self._dial_ssl() if callable(self._dial_ssl) else self._dial_ssl
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                transport, protocol = await loop.create_connection(
                    lambda: OutboundProtocol(link), host, port, ssl=dial_ssl,
                    server_hostname=host if dial_ssl is not None else None,
                )
        except SSLError as exc:  # (an OSError) not a peer that is down: say why, loudly
            link.stats.errors += 1
            logger.warning("%s: TLS to %s at %s:%s failed: %s", self.node_id, link.peer, host,
                           port, exc)
            return None
        except (OSError, TimeoutError) as exc:
            logger.debug("%s: dialing %s at %s:%s failed: %r", self.node_id, link.peer, host,
                         port, exc)
            return None
        if protocol.closed.done():  # lost before we got here
            return protocol
        why = refusal(transport, self.group, link.peer) if self.peer_identity else None
        if why is not None:  # not the peer we meant: nothing of ours goes to it
            link.stats.errors += 1
            logger.warning("%s: refusing %s at %s:%s: %s", self.node_id, link.peer, host, port, why)
            transport.abort()
            return None
        self._go_live(link, transport, protocol)
        return protocol

    def _go_live(self, link: Link, transport: asyncio.Transport,
                 protocol: OutboundProtocol) -> None:
        if link.connects:
            link.stats.reconnects += 1
        link.connects += 1
        link.protocol = protocol
        transport.write(self._hello_frame)
        pending = link.pending
        while pending:
            self._write(link, transport, pending.popleft())
        link.transport = transport

    def _backoff_s(self, attempt: int) -> float:
        """Jittered exponential backoff: uniform in [ceiling / 2, ceiling], never below min."""
        ceiling = min(self._backoff_max_s, self._backoff_min_s * 2.0 ** min(attempt, 32))
        return self._rng.uniform(max(self._backoff_min_s, ceiling / 2), ceiling)

    # --- observability -----------------------------------------------------------------------

    def stats_of(self, peer: str) -> PeerStats:
        """The live counters of ``peer`` (created on first use)."""
        stats = self._stats.get(peer)
        if stats is None:
            stats = self._stats[peer] = PeerStats()
        return stats

    def stats(self) -> dict[str, dict[str, int]]:
        """Counters per peer (plus UNATTRIBUTED), with the pending queue length and whether the
        outbound connection is up."""
        out: dict[str, dict[str, int]] = {}
        for peer, stats in self._stats.items():
            row = dataclasses.asdict(stats)
            link = self._links.get(peer)
            row["pending"] = len(link.pending) if link is not None else 0
            row["connected"] = int(link is not None and link.transport is not None)
            out[peer] = row
        return out
