"""Receipt and recall handles that a client cannot make up (issue 35): the pure signer
(``broker.frontends.grpc.handles``), the configuration that refuses a gRPC endpoint without the
cluster credential it signs with, and the batch checker (``chaos.live.checkers.batch``) the
live batch tests use; against a 3-node group (tests/frontends/conftest.py), guessed and altered
receipt handles refused by name and a genuine one honoured by any node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as sv

from broker.config import BrokerConfig
from broker.frontends.grpc.codec import GatewayError
from broker.frontends.grpc.consume import parse_handle
from broker.frontends.grpc.handles import HANDLE_CHARS_MAX, HandleSigner, RecallTarget
from chaos.live.checkers.batch import Stored, check_batches
from dledger.node.config import NodeConfig
from tests.frontends.raw import META, grpc_addresses, message, receive, send, statuses, stub

KEY = b"k" * 40


def refused(fn: object, *args: object, code: int, match: str) -> None:
    with pytest.raises(GatewayError, match=match) as caught:
        fn(*args)  # type: ignore[operator]
    assert caught.value.code == code


def test_a_receipt_handle_opens_only_unaltered_for_its_topic_and_group() -> None:
    signer = HandleSigner(KEY)
    handle = signer.sign_receipt("a/3/17/42", "orders", "billing")
    assert handle.startswith("a/3/17/42.")
    assert signer.open_receipt(handle, "orders", "billing") == "a/3/17/42"
    assert HandleSigner(KEY).open_receipt(handle, "orders", "billing") == "a/3/17/42"  # any node
    bad = pb.Code.INVALID_RECEIPT_HANDLE
    text, _, mac = handle.rpartition(".")
    for forged in ("a/3/17/43." + mac,  # another epoch under the same signature
                   text + "." + ("A" if mac[0] != "A" else "B") + mac[1:],  # an altered signature
                   HandleSigner(b"x" * 40).sign_receipt(text, "orders", "billing")):  # another key
        refused(signer.open_receipt, forged, "orders", "billing", code=bad, match="forged")
    refused(signer.open_receipt, handle, "orders", "audit", code=bad, match="forged")
    refused(signer.open_receipt, handle, "payments", "billing", code=bad, match="forged")
    refused(signer.open_receipt, "a/3/17/42", "orders", "billing", code=bad,
            match="unsigned")  # the old, guessable form
    refused(signer.open_receipt, "", "orders", "billing", code=bad, match="empty")
    for odd in (text + ".é" + mac[1:], text + "." + mac[:-1] + "\udcff"):  # not ASCII
        refused(signer.open_receipt, odd, "orders", "billing", code=bad, match="forged")
    refused(signer.open_receipt, "x" * (HANDLE_CHARS_MAX + 1), "orders", "billing", code=bad,
            match="over")
    for text in ("a/\u00b2/17/42", "a/3/\u0663/42"):  # digits to isdigit() that int() refuses or
        refused(parse_handle, text, code=bad, match="not a receipt handle")  # reads: refused
    assert parse_handle("a/3/17/42") == ("a", 3, 17, 42)


def test_a_recall_handle_names_its_message_and_opens_only_for_its_topic() -> None:
    signer = HandleSigner(KEY)
    target = RecallTarget("a", "later", "01ABC", 123_456, 2, 1_700_000_000_000)
    handle = signer.sign_recall(target)
    assert signer.open_recall(handle, "later") == target
    refused(signer.open_recall, handle, "sooner", code=pb.Code.BAD_REQUEST, match="forged")
    text, _, mac = handle.rpartition(".")
    altered = text[:-2] + ("AA" if text[-2:] != "AA" else "BB") + "." + mac
    refused(signer.open_recall, altered, "later", code=pb.Code.BAD_REQUEST, match="forged")
    refused(signer.open_recall, "a-000000000001E240-2", "later", code=pb.Code.BAD_REQUEST,
            match="unsigned")
    with pytest.raises(ValueError, match="cluster credential"):
        HandleSigner(b"")


def test_a_grpc_endpoint_without_the_cluster_credential_is_refused_by_name(
        tmp_path: Path) -> None:
    node = NodeConfig(group="g", node_id="n0", peers={"n0": ("127.0.0.1", 1)},
                      data_dir=str(tmp_path))
    ns = (("127.0.0.1", 9876),)
    with pytest.raises(ValueError, match="signs the receipt and recall handles"):
        BrokerConfig(node, grpc_listen=("127.0.0.1", 0), namesrv=ns)
    BrokerConfig(node, grpc_listen=("127.0.0.1", 0), namesrv=ns, cluster_key=KEY)


def _stored(batch: str, queue: str, first: int, n: int = 3) -> list[Stored]:
    return [Stored(f"{batch}-{i}", queue, first + i) for i in range(n)]


def test_the_batch_checker_names_torn_scattered_doubled_and_lost_batches() -> None:
    batches = {b: [f"{b}-{i}" for i in range(3)] for b in ("ok", "absent", "torn", "split",
                                                            "shuffled", "twice", "lost")}
    stored = [*_stored("ok", "a/t/0", 0), *_stored("torn", "a/t/1", 0, n=2),
              *_stored("split", "a/t/1", 2, n=2), Stored("split-2", "a/t/2", 0),
              Stored("shuffled-0", "a/t/0", 5), Stored("shuffled-1", "a/t/0", 4),
              Stored("shuffled-2", "a/t/0", 6), *_stored("twice", "a/t/3", 0),
              Stored("twice-1", "a/t/3", 3)]
    v = check_batches(batches, {"ok", "torn", "lost"}, stored)
    assert (v.batches, v.acked, v.present) == (7, 3, 1)
    assert [line.split(":")[0] for line in v.torn] == ["torn"]
    assert sorted(line.split(":")[0] for line in v.scattered) == ["shuffled", "split"]
    assert [line.split(":")[0] for line in v.twice] == ["twice"]
    assert [line.split(" ")[0] for line in v.lost] == ["lost"]  # (absent: never acknowledged)
    assert not v.ok and len(v.lines()) == 5
    assert check_batches({"ok": batches["ok"]}, {"ok"}, _stored("ok", "a/t/0", 7)).ok


def _leader_applied(ns: str) -> int:
    st = statuses(ns)
    return max(s["applied_index"] for s in st.values() if s["raft"]["role"] == "leader")


def _ack(s: Any, topic: str, group: str, *handles: str) -> list[int]:
    req = sv.AckMessageRequest(entries=[sv.AckMessageEntry(message_id="m", receipt_handle=h)
                                        for h in handles])
    req.topic.name, req.group.name = topic, group
    return [e.status.code for e in s.AckMessage(req, timeout=20, metadata=META).entries]


def _change(s: Any, topic: str, group: str, handle: str) -> Any:
    req = sv.ChangeInvisibleDurationRequest(receipt_handle=handle, message_id="m")
    req.topic.name, req.group.name = topic, group
    req.invisible_duration.FromSeconds(30)
    return s.ChangeInvisibleDuration(req, timeout=10, metadata=META)


def _dead(s: Any, topic: str, group: str, handle: str) -> Any:
    req = sv.ForwardMessageToDeadLetterQueueRequest(receipt_handle=handle, message_id="m",
                                                    max_delivery_attempts=1)
    req.topic.name, req.group.name = topic, group
    return s.ForwardMessageToDeadLetterQueue(req, timeout=10, metadata=META)


@pytest.mark.slow
def test_a_receipt_handle_cannot_be_guessed_or_altered_and_any_node_honours_a_genuine_one(
        cluster: tuple[str, str]) -> None:
    """Before issue 35 a receipt handle was ``<group>/<queue>/<offset>/<epoch>``, the epoch the
    index of the log entry that handed the message out: a client that knew the message's queue
    and offset could try the few indexes around the leader's and acknowledge (or dead-letter)
    a message another consumer held. Now every such guess, and any altered handle, is refused
    by name on all three calls; a genuine one works on any node, a new receipt after a change."""
    ns, _ = cluster
    topic, group = "sealed", "sealed-group"
    a, b, c = sorted(grpc_addresses(ns).values())
    with stub(a) as s:
        assert send(s, message(topic, b"held", "01SEALED")).status.code == pb.Code.OK
        before = _leader_applied(ns)
        (m,) = receive(s, topic, group)
        after = _leader_applied(ns)
        handle = m.system_properties.receipt_handle
        sp = m.system_properties
        guesses = [f"a/{sp.queue_id}/{sp.queue_offset}/{epoch}"
                   for epoch in range(max(0, before - 2), after + 3)]
        bad = pb.Code.INVALID_RECEIPT_HANDLE
        assert _ack(s, topic, group, *guesses) == [bad] * len(guesses)
        for guess in guesses[:3]:
            assert _change(s, topic, group, guess).status.code == bad
            assert _dead(s, topic, group, guess).status.code == bad
        text, _, mac = handle.rpartition(".")
        for altered in (f"{text}.{mac[:-1]}{'A' if mac[-1] != 'A' else 'B'}",
                        f"{text[:-1]}{int(text[-1]) ^ 1}.{mac}"):
            assert _ack(s, topic, group, altered) == [bad]
            changed = _change(s, topic, group, altered)
            assert changed.status.code == bad and "forged" in changed.status.message
            assert _dead(s, topic, group, altered).status.code == bad
        assert _ack(s, topic, "another-group", handle) == [bad]  # bound to its group
    with stub(b) as s:  # a node that did not issue it honours it: a new receipt
        changed = _change(s, topic, group, handle)
        assert changed.status.code == pb.Code.OK, changed.status
        assert changed.receipt_handle != handle
    with stub(c) as s:
        assert _ack(s, topic, group, handle) == [bad]  # stale: changed since
        assert _ack(s, topic, group, changed.receipt_handle) == [pb.Code.OK]
        assert receive(s, topic, group, poll_s=1) == []  # acknowledged: never again
