"""Priority in pop consumption's pure part (``broker.features.pop.model``) and its entries: a
pop parks the offsets it passes for a higher priority, a later pop hands them out; a parked
offset counts in the group's offset and the bound, is not acknowledged before it was handed
out, is handed out once, and survives a checkpoint and the entry's encoding (older entries and
checkpoints keep their form)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cbor2
import pytest

from broker.core.codec import Message, message_of
from broker.core.entries import encode_send
from broker.core.read_filter import ReadFilter
from broker.features.pop.entries import KIND_POP, PopAck, PopEntry
from broker.features.pop.model import INFLIGHT_MAX, PopConflict, PopTable
from broker.features.pop.scan import scan_by_priority
from broker.machine.kinds import decode, encode
from broker.machine.state import BrokerState
from dledger.client import LogClient
from protocol import broker_kinds as bp
from protocol.consume_rules import MESSAGE_GROUP_PROPERTY
from protocol.message_ttl import TTL_PROPERTY
from protocol.priority import PRIORITY_PROPERTY
from tests.broker.test_broker_requests import run
from tests.features.test_pop import INV, KEY, _state_with_messages


def test_passed_offsets_are_parked_then_handed_out_once() -> None:
    t = PopTable()
    # offset 5 (a higher priority) out first; 0..4 parked
    out = t.pop(KEY, 10, 1000, INV, 0, 0, 100, (), 0, 6, [(5, None)],
                parked=[(o, 0) for o in range(5)])
    assert out == [(5, 1)]
    q = t.get(KEY)
    assert q is not None and q.cursor == 6 and q.committed() == 0
    assert t.parked(KEY) == {0: 0, 1: 0, 2: 0, 3: 0, 4: 0}
    assert t.ack(KEY, 1000, [(0, 10)]) == [False]  # parked: never handed out, not acked
    assert t.pop(KEY, 11, 1001, INV, 0, 0, 100, (), 6, 6, [], unpark=[0, 1]) == [(0, 1), (1, 1)]
    with pytest.raises(PopConflict):
        t.pop(KEY, 12, 1002, INV, 0, 0, 100, (), 6, 6, [], unpark=[1])  # handed out already
    assert t.ack(KEY, 1002, [(0, 11), (1, 11), (5, 10)]) == [True, True, True]
    assert q.committed() == 2


def test_parked_offsets_count_in_the_bound() -> None:
    t = PopTable()
    t.pop(KEY, 1, 0, INV, 0, 0, 5000, (), 0, INFLIGHT_MAX, [],
          parked=[(o, 0) for o in range(INFLIGHT_MAX)])
    with pytest.raises(PopConflict):
        t.pop(KEY, 2, 0, INV, 0, 0, 5000, (), INFLIGHT_MAX, INFLIGHT_MAX + 1,
              [(INFLIGHT_MAX, None)])


def test_a_pop_entry_with_parked_offsets_round_trips_and_older_forms_stay() -> None:
    e = PopEntry(1000, "g", "t", 0, INV, 0, (), 0, 3, ((2, None),), (), (), ((0, 0), (1, 3)),
                 (7,))
    assert len(cbor2.loads(encode(e))) == 16 and decode(encode(e)) == e
    plain = PopEntry(1000, "g", "t", 0, INV, 0, (), 4, 6, ((4, None),))
    assert len(cbor2.loads(encode(plain))) == 12  # the form before per-group FIFO


def test_the_state_machine_parks_and_a_checkpoint_keeps_them() -> None:
    s = _state_with_messages(4)
    assert s.apply(3, 0, encode(PopEntry(1000, "g", "t", 0, INV, 0, (), 0, 4, ((3, None),),
                                         parked=((0, 0), (1, 0), (2, 0))))).status == "OK"
    assert s.offsets[KEY] == 0
    again = BrokerState.restore(s.snapshot())
    assert again.pops == s.pops and again.pops.parked(KEY) == {0: 0, 1: 0, 2: 0}
    res = again.apply(4, 0, encode(PopEntry(1001, "g", "t", 0, INV, 0, (), 4, 4, (),
                                            unpark=(0, 1, 2))))
    assert res.status == "OK" and res.popped == ((0, 1), (1, 1), (2, 1))
    assert again.apply(5, 0, encode(PopAck(1002, "g", "t", 0, ((0, 4), (1, 4), (2, 4), (3, 3))))
                       ).acked == (True, True, True, True)
    assert again.offsets[KEY] == 4
    assert cbor2.loads(encode(PopEntry(1, "g", "t", 0, INV, 0, (), 0, 0, ())))[1] == KIND_POP


def _message(body: str, priority: int | None = None, group: str | None = None) -> list[Any]:
    props = [[PRIORITY_PROPERTY, str(priority)]] if priority is not None else []
    props += [[MESSAGE_GROUP_PROPERTY, group]] if group is not None else []
    return [body.encode(), "", [], "", props, 0]


async def _receive(client: LogClient, max_messages: int) -> list[str]:
    rows = await client.call("n0", bp.POP_RECEIVE, "g", "p", 0, max_messages, 60_000, ["*"],
                             "", 0, 16)
    return [r[2].decode() for r in rows]


@pytest.mark.slow
def test_a_receive_takes_higher_priorities_first_equal_ones_in_send_order(
        tmp_path: Path) -> None:
    async def scenario(client: LogClient, n0: str) -> None:
        await client.call(n0, bp.TOPIC_PUT, "p", 1, 1, 6)
        await client.call(n0, bp.SEND, "p", 0, [_message("n0"), _message("a", 3), _message("n1"),
                                                _message("b", 7), _message("c", 3)])
        assert await _receive(client, 2) == ["b", "a"]  # n0 and n1 parked, c still fresh
        assert await _receive(client, 32) == ["c", "n0", "n1"]
        assert await _receive(client, 32) == []

    run(tmp_path, scenario)


@pytest.mark.slow
def test_an_ordered_message_at_the_cursor_still_goes_out_with_priorities_behind_it(
        tmp_path: Path) -> None:
    async def scenario(client: LogClient, n0: str) -> None:
        await client.call(n0, bp.TOPIC_PUT, "p", 1, 1, 6)
        await client.call(n0, bp.SEND, "p", 0, [_message("A0", group="A"), _message("hi", 5),
                                                _message("n")])
        assert await _receive(client, 32) == ["hi", "A0", "n"]

    run(tmp_path, scenario)


class _Host:
    """A ScanHost over one send entry's messages (what ``Broker.read_message`` reads)."""

    def __init__(self, messages: list[list[Any]]) -> None:
        self.data = encode_send("p", 0, 1_000, messages, True, 1)
        self.state = BrokerState()
        self.state.apply(1, 100, self.data)

    def read_message(self, position: int, slot: int, entries: dict[int, list[Any]]) -> Message:
        assert position == 100
        return message_of(self.state.registry.stored_messages(self.data)[slot])


def test_expired_messages_past_where_the_cursor_moves_are_not_counted_twice() -> None:
    # a receive looking ahead for priorities examines messages past where the cursor then moves
    # (the highest ones are parked ones): expired ones there are examined again by the next
    # receive, and counted then, not now
    ttl = [[TTL_PROPERTY, "1"]]
    host = _Host([[b"low", "", [], "k0", [[PRIORITY_PROPERTY, "1"]], 1],
                  [b"gone", "", [], "k1", ttl, 1],
                  [b"mid", "", [], "k2", [[PRIORITY_PROPERTY, "2"]], 1]])
    f = ReadFilter(["*"], None, now_ms=10_000, exact_tags=True)
    plan = scan_by_priority(host, "p", 0, 0, 3, room=1, capacity=64, f=f, parked={7: 9},
                            ahead={2: 2})
    assert plan is not None
    fresh, park, unpark, hi = plan
    assert (fresh, unpark, hi) == ([], [7], 0) and park == []  # the parked 9 goes; cursor stays
    assert f.expired == 0  # "gone" (offset 1) is past the cursor: the next receive counts it
    f = ReadFilter(["*"], None, now_ms=10_000, exact_tags=True)
    fresh, park, unpark, hi = scan_by_priority(host, "p", 0, 0, 3, room=2, capacity=64, f=f,
                                               parked={}, ahead={2: 2}) or ([], [], [], -1)
    assert (fresh, hi, f.expired) == ([(0, None), (2, None)], 3, 1)
