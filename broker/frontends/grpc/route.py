"""The route answers of the gRPC endpoint (``broker.frontends.grpc.gateway``): which message queues
a RocketMQ 5 client is told about and at which addresses.

Owns:
- ``node_endpoints``: a group's nodes as ``Endpoints``, **one address each**, the leader's first.
  RocketMQ's proxy answers this way (a broker's ``Endpoints`` built from one address per broker
  id), and the official clients need it: the Node.js client joins an ``Endpoints``' addresses
  with commas into one gRPC target (``dns:h1:p1,h2:p2``), which its resolver refuses.
- ``route_queues``: QueryRoute's message queues. For the Java and Python clients
  (``MULTI_ADDRESS_LANGUAGES``, by the call's ``x-mq-language``) each queue of each group once,
  its ``Endpoints`` every node's address: those clients make one gRPC channel of them (a target
  ``ipv4:h1:p1,h2:p2,...``, its addresses sorted) whose pick-first policy sends every call to one
  node and moves to the next address by itself when that node fails. A client's 64 sends in
  flight then reach one node, which serves them in process if it leads or gathers them into
  few forwarded requests if not: spread over the nodes, the same sends cost the servers twice
  the CPU and ran at 0.6-0.7x the rate (``dledger bench --grpc``, 2026-12-06). For every other
  client (the Node.js client sends ``HTTP``) each queue of each group once per node that serves
  gRPC, queue by queue (``q0@n1, q0@n2, q0@n3, q1@n1 ...``). Every entry says broker id 0
  (RocketMQ's master id): the Java, Python, Go and C# clients send and receive only through
  master entries, and here every node serves a group's calls (a follower forwards them to the
  leader), so each node is one. A client spreads its calls over the entries and, when a send to
  one node fails, tries the next entry, which is another node; the Node.js client 1.0.8 keeps
  only the entries of queue 0 (its filter compares the queue id with the master id), one per
  node, so it too has every node to choose from. Which queue a message is stored in is the
  gateway's choice (``broker.frontends.grpc.sends``), not the entry's.
- ``assignment_endpoints``: the one address QueryAssignment names for a group, where a push
  consumer then receives. A client that can move (Java, Python: a new address makes a new
  process queue) gets the leader's, whose calls need no forward, and follows it at its next
  scan of assignments. The Node.js client 1.0.8 cannot: it keys its process queues by topic,
  broker name and queue id and keeps receiving at the address of its first assignment, so a
  leader's address would strand it when that leader dies. It sends its access point (the
  address its user gave) in the request, so a group's node named there, other than the node
  asked, is named back: the client then receives through the node it depends on anyway.
  (Java sends its access point too but asks that very node when it is in the route; the
  Python client sends the address of the entry it asked, which changes from scan to scan;
  both get the leader's.)

Pure: protocol messages from a route as our client library reads it from the NameServers.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb

from client.cluster.routes import GroupRoute, TopicRoute

__all__ = ["MULTI_ADDRESS_LANGUAGES", "assignment_endpoints", "group_endpoints", "node_endpoints",
           "route_queues"]

# The clients (their x-mq-language) whose channel takes an Endpoints of several addresses (above)
MULTI_ADDRESS_LANGUAGES = frozenset({"JAVA", "PYTHON"})

PERM_READ, PERM_WRITE = 4, 2  # RocketMQ's PermName bits, as the NameServer's routes carry them
_PERMISSIONS = {0: pb.Permission.NONE, 1: pb.Permission.READ, 2: pb.Permission.WRITE,
                3: pb.Permission.READ_WRITE}


def node_endpoints(g: GroupRoute) -> list[Any]:
    """One ``Endpoints`` per node of ``g`` that serves gRPC, each with that node's one address:
    the leader's first, the others by address (empty: no node serves gRPC)."""
    addrs = sorted(g.grpc.values())
    leader = g.grpc.get(g.leader) if g.leader is not None else None
    if leader is not None:
        addrs.remove(leader)
        addrs.insert(0, leader)
    out = []
    for host, port in addrs:
        e = pb.Endpoints(scheme=_scheme(host))
        e.addresses.add(host=host, port=port)
        out.append(e)
    return out


def group_endpoints(g: GroupRoute) -> list[Any]:
    """One ``Endpoints`` with the address of every node of ``g`` that serves gRPC, the leader's
    first (a list of it; empty when no node serves gRPC). Only IP addresses of one family make
    one: otherwise (a DNS name: the clients refuse several in one ``Endpoints``) one per node."""
    nodes = node_endpoints(g)
    if len({n.scheme for n in nodes}) != 1 or nodes[0].scheme == pb.AddressScheme.DOMAIN_NAME:
        return nodes
    e = pb.Endpoints(scheme=nodes[0].scheme)
    for node in nodes:
        e.addresses.add().CopyFrom(node.addresses[0])
    return [e]


def assignment_endpoints(g: GroupRoute, asked: Any, own_node: str) -> Any:
    """The ``Endpoints`` (one address) a consumer's assignment of ``g`` names (see above):
    ``asked`` (the request's ``Endpoints``) when it is one address of a node of ``g`` other than
    ``own_node`` (the node answering), else the leader's; None when no node serves gRPC."""
    nodes = node_endpoints(g)
    if len(asked.addresses) == 1:
        a = asked.addresses[0]
        if (a.host, a.port) != g.grpc.get(own_node):
            for e in nodes:
                if (e.addresses[0].host, e.addresses[0].port) == (a.host, a.port):
                    return e
    return nodes[0] if nodes else None


def route_queues(topic: Any, route: TopicRoute, accepted_types: tuple[int, ...],
                 language: str = "") -> list[Any]:
    """QueryRoute's message queues of ``topic`` (a ``pb.Resource``) for a client of ``language``:
    per group, each queue (``max(read, write)`` of them, each with its permission) once with
    every node's address (``MULTI_ADDRESS_LANGUAGES``), or once per node serving gRPC."""
    queues = []
    for g in route.groups:
        nodes = group_endpoints(g) if language in MULTI_ADDRESS_LANGUAGES else node_endpoints(g)
        for qid in range(max(g.read_queues, g.write_queues)):
            perm = (1 if qid < g.read_queues and g.perm & PERM_READ else 0) \
                | (2 if qid < g.write_queues and g.perm & PERM_WRITE else 0)
            for endpoints in nodes:
                mq = pb.MessageQueue(id=qid, permission=_PERMISSIONS[perm],
                                     accept_message_types=accepted_types)
                mq.topic.CopyFrom(topic)
                mq.broker.name = g.group
                mq.broker.id = 0  # every node serves the group: a master entry (see above)
                mq.broker.endpoints.CopyFrom(endpoints)
                queues.append(mq)
    return queues


def _scheme(host: str) -> int:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return int(pb.AddressScheme.DOMAIN_NAME)
    return int(pb.AddressScheme.IPv4 if ip.version == 4 else pb.AddressScheme.IPv6)
