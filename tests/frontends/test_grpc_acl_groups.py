"""Access control when a RocketMQ 5 client's call is for another broker group's queue (``--acl``
on two groups, one node each): group a's endpoint authenticates the call and sends it on to group
b's leader signed as the same account, and b judges it by its own ACL: the account's send,
receive and ack go through; an account without PUB there is refused FORBIDDEN, one b does not
know UNAUTHORIZED, each next to the same call as an account b lets do it."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as sv
from rocketmq.grpc_protocol import service_pb2_grpc as sg

from broker.features.acl.model import PUB_SUB, SUB, Account
from client import Credentials as OurCredentials
from dledger.client import LogClient
from protocol import broker_kinds as bp
from tests.clusters import namesrv_groups
from tests.frontends.test_grpc_acl import APP, ROOT, metadata

pytestmark = pytest.mark.slow

TOPIC, GROUP = "only-b", "only-b-group"
READER = OurCredentials("reader", "reader-secret")  # SUB on the topic and the group, in a and b
A_ONLY = OurCredentials("aonly", "aonly-secret")  # PUB|SUB, known to group a alone


def _route_shows_b(ns: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{ns}/v1/topics/{TOPIC}/route", timeout=5) as resp:
            return [g["group"] for g in json.loads(resp.read())["groups"]] == ["b"]
    except urllib.error.HTTPError:
        return False


async def _setup(clusters: dict[str, Any]) -> None:
    """The topic on b alone; the accounts in each group's ACL (a knows A_ONLY, b does not)."""
    both = {APP: Account(APP.access_key, APP.secret_key, topic_perms=((TOPIC, PUB_SUB),),
                         group_perms=((GROUP, SUB),)),
            READER: Account(READER.access_key, READER.secret_key, topic_perms=((TOPIC, SUB),),
                            group_perms=((GROUP, SUB),))}
    a_only = Account(A_ONLY.access_key, A_ONLY.secret_key, topic_perms=((TOPIC, PUB_SUB),),
                     group_perms=((GROUP, SUB),))
    for name, accounts in (("a", [*both.values(), a_only]), ("b", list(both.values()))):
        async with LogClient(clusters[name].client_addresses, timeout_s=5, credentials=ROOT,
                             group=name) as client:
            for account in accounts:
                _, answer = await client.call_leader(bp.ACL_PUT, account.row())
                assert answer == "OK"
            if name == "b":
                await client.call_leader(bp.TOPIC_PUT, TOPIC, 2, 2, 6)


def _call(address: str, who: OurCredentials, rpc: str, request: Any) -> Any:
    with grpc.insecure_channel(address) as channel:
        call = getattr(sg.MessagingServiceStub(channel), rpc)
        answer = call(request, timeout=10, metadata=metadata(who))
        return list(answer) if rpc == "ReceiveMessage" else answer


def _send(address: str, who: OurCredentials, body: bytes) -> Any:
    m = pb.Message(body=body)
    m.topic.name = TOPIC
    m.system_properties.message_id = "01" + body.hex()[:30]
    return _call(address, who, "SendMessage", sv.SendMessageRequest(messages=[m])).status


def _receive(address: str, who: OurCredentials) -> tuple[Any, list[Any]]:
    query = sv.QueryAssignmentRequest()
    query.topic.name, query.group.name = TOPIC, GROUP
    assignment = _call(address, who, "QueryAssignment", query)
    assert assignment.status.code == pb.Code.OK, assignment.status
    receive = sv.ReceiveMessageRequest(batch_size=16)
    receive.group.name = GROUP
    receive.message_queue.CopyFrom(assignment.assignments[0].message_queue)
    receive.filter_expression.expression = "*"
    receive.invisible_duration.FromSeconds(30)
    receive.long_polling_timeout.FromSeconds(2)
    answers = _call(address, who, "ReceiveMessage", receive)
    statuses = [r.status for r in answers if r.WhichOneof("content") == "status"]
    return statuses[0], [r.message for r in answers if r.WhichOneof("content") == "message"]


def test_a_call_for_another_groups_queue_is_signed_as_its_account(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    monkeypatch.setenv("DLEDGER_ACL_SECRET_ROOT", ROOT.secret_key)
    monkeypatch.setenv("DLEDGER_ACCESS_KEY", ROOT.access_key)  # (the groups' routing warm-up)
    monkeypatch.setenv("DLEDGER_SECRET_KEY", ROOT.secret_key)
    with namesrv_groups(tmp_path, "--grpc-listen", "127.0.0.1:0", "--acl", "--acl-admin-key",
                        "root", size=1) as (ns, clusters):
        asyncio.run(_setup(clusters))
        deadline = time.monotonic() + 20
        while not _route_shows_b(ns):  # until b's next registration routes the topic to it
            assert time.monotonic() < deadline, "the topic's route never showed group b"
            time.sleep(0.1)  # (polling the NameServer with a deadline)
        host, port = clusters["a"].servers["n0"].ready["grpc"]
        at_a = f"{host}:{port}"

        denied = _send(at_a, READER, b"no PUB at b")
        assert denied.code == pb.Code.FORBIDDEN and "PUB on topic 'only-b'" in denied.message
        unknown = _send(at_a, A_ONLY, b"unknown at b")  # (a authenticates it; b does not know it)
        assert unknown.code == pb.Code.UNAUTHORIZED and "does not match" in unknown.message, \
            unknown
        sent = _send(at_a, APP, b"for b")  # the same send as an account b lets send
        assert sent.code == pb.Code.OK, sent

        st, _ = _receive(at_a, A_ONLY)
        assert st.code == pb.Code.UNAUTHORIZED, st
        st, got = _receive(at_a, APP)  # the same receive as an account b knows
        assert st.code == pb.Code.OK and [m.body for m in got] == [b"for b"], (st, got)
        ack = sv.AckMessageRequest(entries=[sv.AckMessageEntry(
            message_id=got[0].system_properties.message_id,
            receipt_handle=got[0].system_properties.receipt_handle)])
        ack.topic.name, ack.group.name = TOPIC, GROUP
        assert _call(at_a, APP, "AckMessage", ack).status.code == pb.Code.OK

        async def a_status() -> dict[str, Any]:
            async with LogClient(clusters["a"].client_addresses, timeout_s=5,
                                 credentials=ROOT, group="a") as client:
                return dict(await client.call("n0", bp.BROKER_STATUS))
        a = asyncio.run(a_status())
    assert TOPIC not in a["topics"]  # (group a stored nothing of it)
