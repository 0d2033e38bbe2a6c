"""The remoting endpoints given bad frames over a bare remoting connection
(``tests.remoting.raw``): malformed, oversized and inflating frames, a fuzz of them, and what a
review found, each answered by name or with a closed connection, never a crash or a stored half
message (``test_endpoint`` has the codes served)."""

from __future__ import annotations

import asyncio
import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.frames import encode_frame
from protocol.remoting import codes
from protocol.remoting.command import Command, encode
from protocol.remoting.record import (
    decode_records,
    join_properties,
)
from tests.clusters import namesrv_group
from tests.remoting.raw import RawRemoting
from tests.remoting.test_endpoint import _addrs, _send_ext

pytestmark = pytest.mark.xdist_group("remoting-endpoint-frames")


@pytest.fixture(scope="module")
def ns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with namesrv_group(tmp_path_factory.mktemp("remoting-frames"),
                       "--remoting-listen", "127.0.0.1:0") as (address, _):
        yield address


def _frame_of(header: bytes, kind: int = 0, body: bytes = b"") -> bytes:
    return encode_frame(struct.pack(">I", (kind << 24) | len(header)) + header + body)


BAD_FRAMES = {
    "unknown serialization": _frame_of(b"{}", kind=7),
    "header past the frame": encode_frame(struct.pack(">I", 500) + b"{}"),
    "JSON that does not parse": _frame_of(b"{\"code\": 310, \"extFields\": {"),
    "JSON that is not an object": _frame_of(b"[310]"),
    "binary header cut short": _frame_of(b"\x01\x36\x00", kind=1),
    "zero-length frame": struct.pack(">I", 0),
    "frame over the maximum": struct.pack(">I", 64 << 20) + b"\0" * 1024,
}


@pytest.mark.parametrize("name", sorted(BAD_FRAMES))
def test_a_malformed_frame_closes_the_connection_and_stores_nothing(ns: str, name: str) -> None:
    async def run() -> None:
        leader = (await _addrs(ns))["0"]
        async with RawRemoting(leader) as c:
            before = await c.call(codes.GET_MAX_OFFSET, {"topic": "raw-batch", "queueId": "0"})
        for address in (leader, ns):
            async with RawRemoting(address) as c:
                c.send_raw(BAD_FRAMES[name])
                assert await c.closed(), f"{address} kept the connection after: {name}"
        async with RawRemoting(leader) as c:  # the node serves on, nothing was stored
            after = await c.call(codes.GET_MAX_OFFSET, {"topic": "raw-batch", "queueId": "0"})
            assert after.ext["offset"] == before.ext["offset"]
    asyncio.run(run())


def test_oversized_and_inflating_bodies_are_refused_by_name(ns: str) -> None:
    async def run() -> None:
        leader = (await _addrs(ns))["0"]
        async with RawRemoting(leader) as c:
            big = await c.call(codes.SEND_MESSAGE_V2, _send_ext("raw-big"), b"x" * (5 << 20))
            assert big.code == codes.MESSAGE_ILLEGAL, big.remark
            bomb = zlib.compress(b"\0" * (64 << 20))
            inflated = await c.call(codes.SEND_MESSAGE_V2, _send_ext("raw-big", sys_flag=1), bomb)
            assert inflated.code == codes.MESSAGE_ILLEGAL and "inflates" in inflated.remark
            garbage = await c.call(codes.SEND_MESSAGE_V2, _send_ext("raw-big", sys_flag=1),
                                   b"not zlib")
            assert garbage.code == codes.MESSAGE_ILLEGAL
            batch = await c.call(codes.SEND_BATCH_MESSAGE, _send_ext("raw-big"), b"\0\0\0\x30cut")
            assert batch.code == codes.MESSAGE_ILLEGAL
            top = await c.call(codes.GET_MAX_OFFSET, {"topic": "raw-big", "queueId": "0"})
            assert top.code != codes.SUCCESS or top.ext["offset"] == "0"
            ok = await c.call(codes.SEND_MESSAGE_V2, _send_ext("raw-big"), b"small")
            assert ok.code == codes.SUCCESS
    asyncio.run(run())


def test_a_command_round_trips_in_both_header_forms(tmp_path: Path) -> None:
    from protocol.remoting.command import decode
    for form in (codes.JSON, codes.ROCKETMQ):
        cmd = Command(310, 7, codes.FLAG_ONEWAY, "r\u00e9mark", {"b": "topic", "e": "3"}, b"body",
                      serialization=form)
        back = decode(encode(cmd))
        assert (back.code, back.opaque, back.flag, back.remark, back.ext, back.body) == \
            (310, 7, codes.FLAG_ONEWAY, "r\u00e9mark", {"b": "topic", "e": "3"}, b"body")
        assert back.is_oneway and not back.is_response


def test_a_fuzz_of_malformed_frames_leaves_every_listener_serving(ns: str) -> None:
    """300 malformed frames (random bytes as a header of either form, a send's frame cut or its
    header word changed), each on its own connection, at a broker node and the NameServer: both
    serve on and nothing was stored."""
    import random
    rng = random.Random(20261206)
    valid = encode(Command(codes.SEND_MESSAGE_V2, 1, ext=_send_ext("raw-fuzz"), body=b"fuzz"))

    def malformed() -> bytes:
        choice = rng.randrange(4)
        if choice == 0:  # random bytes as a JSON header
            junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
            return _frame_of(b"{" + junk)
        if choice == 1:  # random bytes as a binary header, too short for its fields
            return _frame_of(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 12))),
                             kind=1)
        if choice == 2:  # the send cut inside its header
            return encode_frame(valid[: rng.randrange(1, 40)])
        word = struct.pack(">I", (rng.randrange(2, 256) << 24) | (len(valid) - 4))
        return encode_frame(word + valid[4:])  # an unknown serialization

    async def run() -> None:
        leader = (await _addrs(ns))["0"]
        for _ in range(150):
            for address in (leader, ns):
                async with RawRemoting(address) as c:
                    c.send_raw(malformed())
                    assert await c.closed(), address
        async with RawRemoting(leader) as c:
            top = await c.call(codes.GET_MAX_OFFSET, {"topic": "raw-fuzz", "queueId": "0"})
            assert top.code != codes.SUCCESS or top.ext["offset"] == "0"
        async with RawRemoting(ns) as c:
            assert (await c.call(codes.GET_BROKER_CLUSTER_INFO)).code == codes.SUCCESS
    asyncio.run(run())


def test_what_a_review_found_is_answered_by_name(ns: str) -> None:
    """An offset past the queue's end moves the client to the end (not back to where it asked);
    a stored property a record cannot carry as a number does not break pulls; a duplicate's
    answer names the original's queue; a cut compressed body, a lock request with a malformed
    queue and a header string that is no UTF-8 are refused by name."""
    async def run() -> None:
        leader = (await _addrs(ns))["0"]
        async with RawRemoting(leader) as c:
            odd = join_properties("", [], "odd-1", [["RECONSUME_TIME", "\u00b2"]])
            first = await c.call(codes.SEND_MESSAGE_V2, _send_ext("raw-review", 0, odd), b"odd")
            assert first.code == codes.SUCCESS, first.remark
            again = await c.call(codes.SEND_MESSAGE_V2, _send_ext("raw-review", 1, odd), b"odd")
            assert again.code == codes.SUCCESS and again.ext["queueId"] == "0"  # the original's
            pulled = await c.call(codes.PULL_MESSAGE, {
                "consumerGroup": "g", "topic": "raw-review", "queueId": "0", "queueOffset": "0",
                "maxMsgNums": "8", "sysFlag": "0", "suspendTimeoutMillis": "0",
                "subscription": "*"})
            assert pulled.code == codes.SUCCESS and decode_records(pulled.body)[0].body == b"odd"
            past = await c.call(codes.PULL_MESSAGE, {
                "consumerGroup": "g", "topic": "raw-review", "queueId": "0", "queueOffset": "50",
                "maxMsgNums": "8", "sysFlag": "0", "suspendTimeoutMillis": "0",
                "subscription": "*"})
            assert past.code == codes.PULL_OFFSET_MOVED and past.ext["nextBeginOffset"] == "1"
            cut = zlib.compress(b"x" * 10_000)[:-8]
            refused = await c.call(codes.SEND_MESSAGE_V2, _send_ext("raw-review", sys_flag=1), cut)
            assert refused.code == codes.MESSAGE_ILLEGAL and "cut short" in refused.remark
            lock = await c.call(codes.LOCK_BATCH_MQ, body=json.dumps(
                {"consumerGroup": "g", "clientId": "c", "mqSet": [{"topic": "t", "queueId": "x"}]}
            ).encode())
            assert lock.code == codes.INVALID_PARAMETER and "queueId" in lock.remark
        async with RawRemoting(leader) as c:
            header = b'{"code":310,"opaque":1,"extFields":{"b":"t\\ud800"}}'
            c.send_raw(_frame_of(header))
            assert await c.closed()
    asyncio.run(run())
