"""Peer transport over real loopback sockets: delivery, order, reconnects, bounds, hostile peers.

Every wait is on a condition with a deadline (``wait_until``), never a bare sleep.
"""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dledger.network.transport import HELLO_BYTES_MAX, UNATTRIBUTED, PeerTransport
from dledger.network.wire import Hello, encode_message
from dledger.raft.types import AppendRequest, Entry, EntryKind, Heartbeat, Message
from protocol.frames import encode_frame

HOST = "127.0.0.1"


async def wait_until(pred: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll ``pred`` until it holds; fail the test if ``timeout_s`` passes first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.005)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), timeout=20))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class Node:
    """A transport plus the inbox its on_message fills."""

    def __init__(self, node_id: str, *, group: str = "g", port: int = 0,
                 dial: dict[str, tuple[str, int]] | None = None, **options: Any) -> None:
        self.inbox: list[Message] = []
        options.setdefault("backoff_min_s", 0.01)
        options.setdefault("backoff_max_s", 0.05)
        self.transport = PeerTransport(
            node_id, group, (HOST, port), dict(dial or {}), self.inbox.append,
            rng=random.Random(7), **options,
        )
        self.addr: tuple[str, int] = (HOST, port)

    async def start(self) -> Node:
        self.addr = await self.transport.start()
        return self

    def stat(self, peer: str, key: str) -> int:
        return self.transport.stats().get(peer, {}).get(key, 0)

    def commits_from(self, src: str) -> list[int]:
        return [m.commit for m in self.inbox if isinstance(m, Heartbeat) and m.src == src]


def beat(src: str, dst: str, commit: int) -> Heartbeat:
    return Heartbeat(term=1, src=src, dst=dst, commit=commit)


async def mesh(*node_ids: str, **options: Any) -> list[Node]:
    nodes = [await Node(n, **options).start() for n in node_ids]
    for a in nodes:
        for b in nodes:
            if a is not b:
                a.transport.set_dial(b.transport.node_id, b.addr)
    return nodes


async def stop_all(*nodes: Node) -> None:
    for n in nodes:
        await n.transport.stop()


# --- delivery -----------------------------------------------------------------------------


def test_two_nodes_deliver_both_ways_in_order() -> None:
    async def scenario() -> None:
        a, b = await mesh("a", "b")
        for i in range(300):
            assert a.transport.send(beat("a", "b", i))
            assert b.transport.send(beat("b", "a", i))
        await wait_until(lambda: len(a.inbox) == 300 and len(b.inbox) == 300)
        assert b.commits_from("a") == list(range(300))
        assert a.commits_from("b") == list(range(300))
        assert a.stat("b", "sent") + a.stat("b", "pending") == 300
        assert b.stat("a", "received") == 300
        await stop_all(a, b)

    run(scenario)


def test_three_nodes_all_to_all_in_order_with_large_frames() -> None:
    async def scenario() -> None:
        nodes = await mesh("a", "b", "c")
        await wait_until(lambda: all(n.stat(p, "connected") for n in nodes
                                     for p in {"a", "b", "c"} - {n.transport.node_id}))
        big = tuple(Entry(i, 1, EntryKind.NORMAL, bytes([i]) * 300_000) for i in range(1, 4))
        for n in nodes:
            me = n.transport.node_id
            for peer in {"a", "b", "c"} - {me}:
                for i in range(50):
                    n.transport.send(beat(me, peer, i))
                n.transport.send(AppendRequest(1, me, peer, 0, 0, big, 0))
        await wait_until(lambda: all(len(n.inbox) == 102 for n in nodes))
        for n in nodes:
            for peer in {"a", "b", "c"} - {n.transport.node_id}:
                assert n.commits_from(peer) == list(range(50))
            appends = [m for m in n.inbox if isinstance(m, AppendRequest)]
            assert [m.entries for m in appends] == [big, big]
        await stop_all(*nodes)

    run(scenario)


def test_unknown_destination_is_dropped_and_counted() -> None:
    async def scenario() -> None:
        (a,) = await mesh("a")
        assert a.transport.send(beat("a", "nobody", 1)) is False
        assert a.stat(UNATTRIBUTED, "dropped") == 1
        await a.transport.stop()

    run(scenario)


# --- reconnects ---------------------------------------------------------------------------


def test_a_peer_with_no_address_is_dialed_where_its_hello_says_it_listens() -> None:
    """A member that joined on an empty disk knows only its --peers list; a leader added after
    that list dials it, and the member answers at the address the leader's Hello gave."""
    async def scenario() -> None:
        joined = await Node("joined").start()
        leader = await Node("leader", dial={"joined": joined.addr}).start()
        assert joined.transport.send(beat("joined", "leader", 0)) is False  # no address yet
        assert leader.transport.send(beat("leader", "joined", 1))
        await wait_until(lambda: joined.commits_from("leader") == [1])
        assert joined.transport.send(beat("joined", "leader", 2))
        await wait_until(lambda: leader.commits_from("joined") == [2])
        assert joined.transport.dial_address("leader") == leader.addr
        # a configured address is never replaced by what a Hello says
        other = await Node("leader2", dial={"joined": joined.addr}).start()
        configured = (HOST, free_port())
        joined.transport.set_dial("leader2", configured)
        other.transport.send(beat("leader2", "joined", 3))
        await wait_until(lambda: joined.commits_from("leader2") == [3])
        assert joined.transport.dial_address("leader2") == configured
        await stop_all(joined, leader, other)

    run(scenario)


def test_a_hello_with_a_bad_listen_address_is_ignored() -> None:
    async def scenario() -> None:
        a = await Node("a").start()
        for text in ("nonsense", "h:0", "h:99999", "h:x"):
            a.transport.learn_address("b", text, "127.0.0.1:5")
        assert a.transport.dial_address("b") is None
        a.transport.learn_address("b", "0.0.0.0:7", "127.0.0.1:5")
        assert a.transport.dial_address("b") == ("127.0.0.1", 7)
        a.transport.learn_address("c", "[::]:8", "::1:5")
        assert a.transport.dial_address("c") == ("::1", 8)
        await stop_all(a)

    run(scenario)


def test_the_owner_decides_whether_and_where_a_peer_is_dialed_back() -> None:
    """The node's resolver: a proxy's address for a peer (the chaos suite's --dial map), or
    None: no link learned at all (a node that is not catching up on an empty disk)."""
    async def scenario() -> None:
        a = await Node("a", resolve=lambda p, said: {"b": ("127.0.0.1", 9)}.get(p)).start()
        a.transport.learn_address("b", "127.0.0.1:7", "127.0.0.1:5")
        assert a.transport.dial_address("b") == ("127.0.0.1", 9)
        a.transport.learn_address("c", "127.0.0.1:7", "127.0.0.1:5")
        assert a.transport.dial_address("c") is None
        await stop_all(a)

    run(scenario)


def test_peer_that_starts_later_gets_the_queued_messages() -> None:
    async def scenario() -> None:
        port = free_port()
        a = await Node("a", dial={"b": (HOST, port)}).start()
        for i in range(5):
            assert a.transport.send(beat("a", "b", i))
        assert a.stat("b", "pending") == 5 and a.stat("b", "connected") == 0
        b = await Node("b", port=port).start()
        await wait_until(lambda: len(b.inbox) == 5)
        assert b.commits_from("a") == [0, 1, 2, 3, 4]
        await stop_all(a, b)

    run(scenario)


def test_restarted_peer_on_the_same_port_is_reached_after_reconnect() -> None:
    async def scenario() -> None:
        b1 = await Node("b").start()
        a = await Node("a", dial={"b": b1.addr}).start()
        a.transport.send(beat("a", "b", 0))
        await wait_until(lambda: len(b1.inbox) == 1)
        await b1.transport.stop()
        await wait_until(lambda: a.stat("b", "connected") == 0)
        for i in range(1, 4):
            a.transport.send(beat("a", "b", i))
        b2 = await Node("b", port=b1.addr[1]).start()
        await wait_until(lambda: len(b2.inbox) == 3)
        assert b2.commits_from("a") == [1, 2, 3]
        assert a.stat("b", "reconnects") >= 1
        await stop_all(a, b2)

    run(scenario)


def test_set_dial_moves_the_link_to_another_address() -> None:
    async def scenario() -> None:
        b1 = await Node("b").start()
        b2 = await Node("b").start()
        a = await Node("a", dial={"b": b1.addr}).start()
        a.transport.send(beat("a", "b", 1))
        await wait_until(lambda: len(b1.inbox) == 1)
        a.transport.set_dial("b", b2.addr)
        await wait_until(lambda: a.stat("b", "connected") == 1 and a.stat("b", "reconnects") == 1)
        a.transport.send(beat("a", "b", 2))
        await wait_until(lambda: len(b2.inbox) == 1)
        assert b2.commits_from("a") == [2] and len(b1.inbox) == 1
        await stop_all(a, b1, b2)

    run(scenario)


# --- refusals and bounds ------------------------------------------------------------------


def test_wrong_group_is_refused() -> None:
    async def scenario() -> None:
        b = await Node("b", group="g2").start()
        a = await Node("a", group="g1", dial={"b": b.addr}).start()
        a.transport.send(beat("a", "b", 1))
        await wait_until(lambda: b.stat(UNATTRIBUTED, "errors") >= 2)  # refused, and again
        assert b.inbox == []
        assert a.stat("b", "reconnects") >= 1
        await stop_all(a, b)

    run(scenario)


def test_pending_queue_is_bounded_and_drops_the_oldest() -> None:
    async def scenario() -> None:
        port = free_port()
        a = await Node("a", dial={"b": (HOST, port)}, pending_frames_max=3).start()
        results = [a.transport.send(beat("a", "b", i)) for i in range(10)]
        assert all(results)
        assert a.stat("b", "dropped") == 7 and a.stat("b", "pending") == 3
        b = await Node("b", port=port).start()
        await wait_until(lambda: len(b.inbox) == 3)
        assert b.commits_from("a") == [7, 8, 9]
        await stop_all(a, b)

    run(scenario)


def test_full_write_buffer_drops_instead_of_growing() -> None:
    async def scenario() -> None:
        stalled: list[asyncio.StreamWriter] = []
        server = await asyncio.start_server(lambda r, w: stalled.append(w), HOST, 0)
        port = server.sockets[0].getsockname()[1]
        a = await Node("a", dial={"b": (HOST, port)}, send_buffer_bytes_max=256 * 1024).start()
        await wait_until(lambda: a.stat("b", "connected") == 1)
        entries = (Entry(1, 1, EntryKind.NORMAL, b"x" * 65536),)
        msg = AppendRequest(1, "a", "b", 0, 0, entries, 0)
        for _ in range(20_000):  # the peer never reads: kernel buffers fill, then ours
            if not a.transport.send(msg):
                break
        assert a.stat("b", "dropped") == 1
        await a.transport.stop()
        for w in stalled:
            w.close()
        server.close()
        await server.wait_closed()

    run(scenario)


def test_send_after_stop_is_refused_and_stop_is_idempotent() -> None:
    async def scenario() -> None:
        a, b = await mesh("a", "b")
        await a.transport.stop()
        await a.transport.stop()
        assert a.transport.send(beat("a", "b", 1)) is False
        await b.transport.stop()

    run(scenario)


# --- hostile peers ------------------------------------------------------------------------

HELLO = encode_frame(encode_message(Hello("g", "x")))


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(encode_frame(b"\xff\x00garbage"), id="garbage-before-hello"),
        pytest.param(HELLO + encode_frame(b"\xff\x00garbage"), id="garbage-after-hello"),
        pytest.param(HELLO + b"\xff\xff\xff\xff", id="oversized-length-prefix"),
        pytest.param(HELLO + b"\x00\x00\x00\x00", id="zero-length-frame"),
        pytest.param(encode_frame(encode_message(beat("x", "b", 1))), id="no-hello"),
        pytest.param(HELLO + encode_frame(encode_message(beat("x", "c", 1))), id="wrong-dst"),
        pytest.param(HELLO + encode_frame(encode_message(beat("y", "b", 1))), id="wrong-src"),
        pytest.param(HELLO + HELLO, id="second-hello"),
        # most of a 1 MiB frame from a connection that never said Hello: not held
        pytest.param(b"\x00\x10\x00\x00" + b"x" * (HELLO_BYTES_MAX + 1),
                     id="large-frame-before-hello"),
    ],
)
def test_malformed_input_closes_that_connection_but_the_server_keeps_serving(
    garbage: bytes,
) -> None:
    async def scenario() -> None:
        a, b = await mesh("a", "b")
        reader, writer = await asyncio.open_connection(*b.addr)
        writer.write(garbage)
        assert await asyncio.wait_for(reader.read(), timeout=5) == b""  # closed by b
        writer.close()
        errors = b.stat(UNATTRIBUTED, "errors") + b.stat("x", "errors")
        assert errors == 1
        assert b.inbox == []
        a.transport.send(beat("a", "b", 42))
        await wait_until(lambda: b.commits_from("a") == [42])
        await stop_all(a, b)

    run(scenario)


def test_a_good_raw_peer_is_served_alongside() -> None:
    async def scenario() -> None:
        (b,) = await mesh("b")
        _reader, writer = await asyncio.open_connection(*b.addr)
        writer.write(HELLO + b"".join(encode_frame(encode_message(beat("x", "b", i)))
                                       for i in range(3)))
        await wait_until(lambda: b.commits_from("x") == [0, 1, 2])
        assert b.stat("x", "received") == 3
        writer.close()
        await b.transport.stop()

    run(scenario)


def test_a_large_frame_right_behind_the_hello_in_one_write_is_delivered() -> None:
    async def scenario() -> None:
        (b,) = await mesh("b")
        big = AppendRequest(term=1, src="x", dst="b", prev_log_index=0, prev_log_term=0,
                            entries=(Entry(1, 1, EntryKind.NORMAL, b"y" * (1 << 20)),),
                            leader_commit=0)
        _reader, writer = await asyncio.open_connection(*b.addr)
        writer.write(HELLO + encode_frame(encode_message(big)))  # as a dialer writes them
        await wait_until(lambda: len(b.inbox) == 1)
        assert b.inbox[0] == big and b.stat("x", "errors") == 0
        writer.close()
        await b.transport.stop()

    run(scenario)


def test_the_owner_hears_once_per_read_after_that_reads_messages() -> None:
    # on_batch_end lets the node handle what one read brought as one batch.
    async def scenario() -> None:
        events: list[object] = []
        transport = PeerTransport("b", "g", (HOST, 0), {}, lambda m: events.append(m.commit),
                                  rng=random.Random(3), on_batch_end=lambda: events.append("end"))
        addr = await transport.start()
        _reader, writer = await asyncio.open_connection(*addr)
        writer.write(HELLO)  # a read with no message in it: no batch end
        await writer.drain()
        writer.write(b"".join(encode_frame(encode_message(beat("x", "b", i))) for i in range(3)))
        await wait_until(lambda: events[-1:] == ["end"] and events.count("end") + 3 == len(events))
        assert [e for e in events if e != "end"] == [0, 1, 2]
        assert events[0] == 0  # no batch end before the first message
        assert all(events[k - 1] != "end" for k, e in enumerate(events) if e == "end")
        writer.close()
        await transport.stop()

    run(scenario)


def test_a_far_end_that_writes_on_a_dialed_link_is_disconnected() -> None:
    async def scenario() -> None:
        async def chatty(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"unexpected")
            await reader.read()  # until the dialer hangs up
            writer.close()

        server = await asyncio.start_server(chatty, HOST, 0)
        a = await Node("a", dial={"b": server.sockets[0].getsockname()[:2]}).start()
        await wait_until(lambda: a.stat("b", "errors") >= 2 and a.stat("b", "reconnects") >= 1)
        await a.transport.stop()
        server.close()
        await server.wait_closed()

    run(scenario)


def test_backoff_is_jittered_bounded_and_grows() -> None:
    transport = PeerTransport("a", "g", (HOST, 0), {}, lambda m: None, rng=random.Random(3),
                              backoff_min_s=0.05, backoff_max_s=1.0)
    delays = [[transport._backoff_s(attempt) for attempt in range(1, 12)] for _ in range(50)]
    assert all(0.05 <= d <= 1.0 for row in delays for d in row)
    assert max(row[0] for row in delays) <= 0.1  # first retry: soon
    assert min(row[-1] for row in delays) >= 0.5  # many failures: near the cap
    assert len({row[3] for row in delays}) > 1  # jittered
