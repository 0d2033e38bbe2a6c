"""The NameServer's answers to RocketMQ 4.x clients (the remoting protocol), served on the same
port as its HTTP API (``namesrv.listener`` tells them apart by the first byte).

- 105 GET_ROUTEINFO_BY_TOPIC ``{topic}``: every live group serving the topic as a RocketMQ
  broker: ``brokerDatas`` (``brokerName`` the group, ``brokerAddrs`` the leader's remoting
  address under ``"0"`` and the other nodes' under 1, 2 ... by node id) and ``queueDatas``
  (read and write queue counts, perm). For ``TBW102`` (a 4.x producer's stand-in for a topic not
  created yet) every group with a leader whose first send to a topic creates it, with the
  queues it would create (its --default-queues, which the producer takes when below its own
  count; as RocketMQ routes TBW102 to the brokers that auto-create, with their default topic's
  queues); a group whose broker does not say (an older one), with DEFAULT_QUEUES. A topic
  nobody serves: TOPIC_NOT_EXIST.
- 106 GET_BROKER_CLUSTER_INFO: ``brokerAddrTable`` and ``clusterAddrTable`` (one cluster,
  ``CLUSTER``).
- 206 GET_ALL_TOPIC_LIST_FROM_NAMESERVER: ``{"topicList": [...]}``.
Any other code: REQUEST_CODE_NOT_SUPPORTED. Only nodes that registered a remoting address
(``--remoting-listen``) are in the answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from namesrv.registry import NodeView, Registry
from protocol.framed import ConnectionLimits, FramedProtocol
from protocol.remoting import codes
from protocol.remoting.command import Command, RemotingFrameError, decode, encode

__all__ = ["CLUSTER", "DEFAULT_QUEUES", "RemotingNameServer", "answer"]

CLUSTER = "dledger"  # the one cluster name a 4.x client sees
DEFAULT_QUEUES = 4  # TBW102's queues where a broker does not say: RocketMQ's defaultTopicQueueNums
AUTO_CREATE_PERM = codes.PERM_READ | codes.PERM_WRITE | codes.PERM_INHERIT


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _addrs(leader: str | None, nodes: tuple[NodeView, ...]) -> dict[str, str]:
    """brokerAddrs: the leader's remoting address under "0", the others' under 1, 2 ..."""
    out: dict[str, str] = {}
    others = 0
    for n in sorted(nodes, key=lambda v: v.node_id):
        if not n.remoting_address:
            continue
        if n.node_id == leader:
            out["0"] = n.remoting_address
        else:
            others += 1
            out[str(others)] = n.remoting_address
    return out


def _broker_data(group: str, leader: str | None, nodes: tuple[NodeView, ...]) -> dict[str, Any]:
    return {"cluster": CLUSTER, "brokerName": group, "brokerAddrs": _addrs(leader, nodes)}


def _queue_data(group: str, read: int, write: int, perm: int) -> dict[str, Any]:
    return {"brokerName": group, "readQueueNums": read, "writeQueueNums": write, "perm": perm,
            "topicSysFlag": 0}


def route_body(registry: Registry, topic: str, now_s: float) -> dict[str, Any] | None:
    """GET_ROUTEINFO_BY_TOPIC's answer, or None for a topic no live group serves."""
    brokers, queues = [], []
    if topic == codes.AUTO_CREATE_TOPIC:
        for g in registry.cluster(now_s):
            data = _broker_data(g.group, g.leader, g.nodes)
            n = DEFAULT_QUEUES if g.auto_create_queues is None else g.auto_create_queues
            if "0" in data["brokerAddrs"] and n:
                brokers.append(data)
                queues.append(_queue_data(g.group, n, n, AUTO_CREATE_PERM))
    else:
        for r in registry.route(topic, now_s):
            data = _broker_data(r.group, r.leader, r.nodes)
            if data["brokerAddrs"]:
                brokers.append(data)
                queues.append(_queue_data(r.group, r.topic.read_queues, r.topic.write_queues,
                                          r.topic.perm))
    if not brokers:
        return None
    return {"brokerDatas": brokers, "queueDatas": queues, "filterServerTable": {}}


def answer(registry: Registry, now_s: float, cmd: Command) -> Command:
    """The NameServer's response to one request."""
    if cmd.code == codes.GET_ROUTEINFO_BY_TOPIC:
        topic = cmd.ext.get("topic", "")
        body = route_body(registry, topic, now_s)
        if body is None:
            return cmd.response(codes.TOPIC_NOT_EXIST, f"no route for topic {topic[:200]!r}")
        return cmd.response(codes.SUCCESS, body=_json(body))
    if cmd.code == codes.GET_BROKER_CLUSTER_INFO:
        groups = registry.cluster(now_s)
        table = {g.group: _broker_data(g.group, g.leader, g.nodes) for g in groups}
        return cmd.response(codes.SUCCESS, body=_json(
            {"brokerAddrTable": table, "clusterAddrTable": {CLUSTER: sorted(table)}}))
    if cmd.code == codes.GET_ALL_TOPIC_LIST_FROM_NAMESERVER:
        return cmd.response(codes.SUCCESS, body=_json({"topicList": registry.topics()}))
    return cmd.response(codes.REQUEST_CODE_NOT_SUPPORTED,
                        f"request code {cmd.code} is not supported by this NameServer")


class RemotingNameServer(FramedProtocol):
    """One 4.x client's connection to the NameServer."""

    def __init__(self, registry: Registry, clock: Callable[[], float],
                 limits: ConnectionLimits | None = None) -> None:
        super().__init__(limits=limits)
        self.registry = registry
        self.clock = clock

    def payload_received(self, payload: bytes) -> None:
        try:
            cmd = decode(payload)
        except RemotingFrameError as err:
            self.note_error("bad remoting frame", err)
            if self.transport is not None:
                self.transport.close()
            return
        if cmd.is_response:
            return  # nothing of ours asked
        response = answer(self.registry, self.clock(), cmd)
        if not cmd.is_oneway:
            self.send_payload(encode(response))
