"""Where a RocketMQ 5 client's calls are served: the leader's endpoint serves them in its own
process, a follower's forwards each once to the leader; a topic only another group serves goes
to that group's leader through our client library."""

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

from dledger.client import LogClient
from protocol import broker_kinds as bp
from tests.clusters import namesrv_groups

pytestmark = pytest.mark.slow


async def _leader_nodes(ns: str) -> dict[str, tuple[str, int]]:
    with urllib.request.urlopen(f"http://{ns}/v1/cluster", timeout=5) as resp:
        groups = json.loads(resp.read())["groups"]
    return {n["node_id"]: _addr(n["client_address"]) for n in groups[0]["nodes"]}


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def _nodes(ns: str) -> dict[str, tuple[tuple[str, int], str]]:
    """node id -> (client address, gRPC address), as the NameServer lists them."""
    with urllib.request.urlopen(f"http://{ns}/v1/cluster", timeout=5) as resp:
        groups = json.loads(resp.read())["groups"]
    return {n["node_id"]: (_addr(n["client_address"]), n["grpc_address"])
            for n in groups[0]["nodes"]}


def _grpc_counts(ns: str) -> dict[str, dict[str, Any]]:
    """Each node's gRPC endpoint counts and role (its status)."""
    async def read() -> dict[str, dict[str, Any]]:
        nodes = {nid: client for nid, (client, _) in _nodes(ns).items()}
        async with LogClient(nodes, timeout_s=5) as client:
            return {nid: {**(st := await client.call(nid, bp.BROKER_STATUS))["grpc"],
                          "role": st["raft"]["role"]} for nid in nodes}
    return asyncio.run(read())


def _send_receive_ack(grpc_address: str, topic: str, body: bytes) -> None:
    """One message sent, received and acked with raw calls on one node's endpoint (the
    official client picks the node itself: the address that sorts first)."""
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as sv
    from rocketmq.grpc_protocol import service_pb2_grpc as sg
    meta = [("x-mq-client-id", f"raw-{topic}")]
    with grpc.insecure_channel(grpc_address) as channel:
        stub = sg.MessagingServiceStub(channel)
        m = pb.Message(body=body)
        m.topic.name = topic
        m.system_properties.message_id = f"01{topic}"
        sent = stub.SendMessage(sv.SendMessageRequest(messages=[m]), timeout=10, metadata=meta)
        assert sent.status.code == pb.Code.OK, sent.status
        query = sv.QueryAssignmentRequest()
        query.topic.name, query.group.name = topic, f"{topic}-group"
        assignment = stub.QueryAssignment(query, timeout=10, metadata=meta)
        assert assignment.status.code == pb.Code.OK, assignment.status
        receive = sv.ReceiveMessageRequest(batch_size=16)
        receive.group.name = f"{topic}-group"
        receive.message_queue.CopyFrom(assignment.assignments[0].message_queue)
        receive.filter_expression.expression = "*"
        receive.invisible_duration.FromSeconds(30)
        receive.long_polling_timeout.FromSeconds(5)
        got = [r.message for r in stub.ReceiveMessage(receive, timeout=10, metadata=meta)
               if r.WhichOneof("content") == "message"]
        assert [g.body for g in got] == [body]  # (committed before it was answered: no wait)
        ack = sv.AckMessageRequest(entries=[sv.AckMessageEntry(
            message_id=got[0].system_properties.message_id,
            receipt_handle=got[0].system_properties.receipt_handle)])
        ack.topic.name, ack.group.name = topic, f"{topic}-group"
        acked = stub.AckMessage(ack, timeout=10, metadata=meta)
        assert acked.status.code == pb.Code.OK, acked.status


def test_the_leaders_endpoint_serves_in_process_and_a_followers_forwards_once_to_the_leader(
        cluster: tuple[str, str]) -> None:
    """The gateway is a thin adapter over the node's broker API: on the leader a send, a
    receive and an ack are served in its process (nothing forwarded); on a follower each is
    forwarded once to the leader, which serves it itself (its own count of forwards stays 0)."""
    ns, _ = cluster
    nodes = _nodes(ns)
    for role in ("follower", "leader"):
        for attempt in range(3):  # (again if an election on a slow box moved leadership)
            before = _grpc_counts(ns)
            target = next(nid for nid, st in before.items() if st["role"] == role)
            _send_receive_ack(nodes[target][1], f"inproc-{role}-{attempt}",
                              f"to the {role}".encode())
            after = _grpc_counts(ns)
            if all(after[nid]["role"] == before[nid]["role"] for nid in after):
                break
        else:
            raise AssertionError("leadership moved during every attempt")
        grew = {nid: {k: after[nid][k] - before[nid][k]
                      for k in ("own_group_calls", "forwarded")} for nid in after}
        assert grew[target]["own_group_calls"] == 3  # send, receive, ack: through the API
        if role == "follower":
            assert grew[target]["forwarded"] == 3  # each once to the leader
        else:
            assert grew[target]["forwarded"] == 0  # served in this process
        leader = next(nid for nid, st in after.items() if st["role"] == "leader")
        assert after[leader]["forwarded"] == 0  # the leader never forwards
        assert all(grew[nid]["own_group_calls"] == 0 for nid in after if nid != target)


def test_a_topic_only_another_group_serves_goes_to_that_groups_leader(tmp_path: Path) -> None:
    """Two groups: a send and a receive of a topic only group b serves, made on group a's
    endpoint, go through the client library to b's leader (a stores nothing of it)."""
    with namesrv_groups(tmp_path, "--grpc-listen", "127.0.0.1:0", size=1) as (ns, clusters):
        async def put() -> None:
            async with LogClient(clusters["b"].client_addresses, timeout_s=5) as client:
                await client.call_leader(bp.TOPIC_PUT, "only-b", 2, 2, 6)
        asyncio.run(put())
        deadline = time.monotonic() + 20
        while True:  # until the NameServer routes the topic to b (its next registration)
            try:
                with urllib.request.urlopen(f"http://{ns}/v1/topics/only-b/route",
                                            timeout=5) as resp:
                    if [g["group"] for g in json.loads(resp.read())["groups"]] == ["b"]:
                        break
            except urllib.error.HTTPError:
                pass
            assert time.monotonic() < deadline, "the topic's route never showed group b"
            time.sleep(0.1)  # (polling the NameServer with a deadline)
        a_host, a_port = clusters["a"].servers["n0"].ready["grpc"]
        a_grpc = f"{a_host}:{a_port}"
        _send_receive_ack(a_grpc, "only-b", b"for b")

        async def counts(name: str) -> dict[str, Any]:
            async with LogClient(clusters[name].client_addresses, timeout_s=5) as client:
                st = await client.call("n0", bp.BROKER_STATUS)
                return {"grpc": st["grpc"], "topics": st["topics"]}
        a, b = asyncio.run(counts("a")), asyncio.run(counts("b"))
    assert a["grpc"]["own_group_calls"] == 0 and a["grpc"]["calls"] >= 3
    assert "only-b" not in a["topics"] and "only-b" in b["topics"]
