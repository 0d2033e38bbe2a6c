"""Raw calls of RocketMQ 5's ``MessagingService`` for the gRPC tests of what the official Python
client 5.1.2 cannot ask (batches, the pull consumer's calls, made-up handles): the protocol's
generated stubs, called directly with a client id."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as sv
from rocketmq.grpc_protocol import service_pb2_grpc as sg

from dledger.client import LogClient
from protocol import broker_kinds as bp
from protocol.errors import NodeStoppedError
from tests.frontends.test_grpc_forwarding import _nodes

META = [("x-mq-client-id", "raw-client")]


@contextlib.contextmanager
def stub(address: str) -> Iterator[Any]:
    with grpc.insecure_channel(address) as channel:
        yield sg.MessagingServiceStub(channel)


def message(topic: str, body: bytes, message_id: str, tag: str = "", group: str = "",
            properties: dict[str, str] | None = None,
            kind: int = pb.MessageType.NORMAL) -> Any:
    m = pb.Message(body=body)
    m.topic.name = topic
    sp = m.system_properties
    sp.message_id, sp.tag, sp.message_type = message_id, tag, kind
    if group:
        sp.message_group = group
        sp.message_type = pb.MessageType.FIFO
    m.user_properties.update(properties or {})
    return m


def send(s: Any, *messages: Any, timeout_s: float = 10) -> Any:
    return s.SendMessage(sv.SendMessageRequest(messages=list(messages)), timeout=timeout_s,
                         metadata=META)


def receive(s: Any, topic: str, group: str, invisible_s: int = 30, poll_s: int = 5) -> list[Any]:
    """One ReceiveMessage of the consumer group on the topic's assignment: its messages."""
    query = sv.QueryAssignmentRequest()
    query.topic.name, query.group.name = topic, group
    assignment = s.QueryAssignment(query, timeout=10, metadata=META)
    assert assignment.status.code == pb.Code.OK, assignment.status
    r = sv.ReceiveMessageRequest(batch_size=16)
    r.group.name = group
    r.message_queue.CopyFrom(assignment.assignments[0].message_queue)
    r.filter_expression.expression = "*"
    r.invisible_duration.FromSeconds(invisible_s)
    r.long_polling_timeout.FromSeconds(poll_s)
    return [x.message for x in s.ReceiveMessage(r, timeout=poll_s + 10, metadata=META)
            if x.WhichOneof("content") == "message"]


def statuses(ns: str) -> dict[str, dict[str, Any]]:
    """Each node's status (BROKER_STATUS), by node id: of those that answer (one killed does
    not)."""
    async def read() -> dict[str, dict[str, Any]]:
        nodes = {nid: client for nid, (client, _) in _nodes(ns).items()}
        out = {}
        async with LogClient(nodes, timeout_s=5) as client:
            for nid in nodes:
                try:
                    out[nid] = await client.call(nid, bp.BROKER_STATUS)
                except NodeStoppedError:
                    continue
        return out
    return asyncio.run(read())


def grpc_addresses(ns: str) -> dict[str, str]:
    """Each node's gRPC address, by node id."""
    return {nid: address for nid, (_, address) in _nodes(ns).items()}
