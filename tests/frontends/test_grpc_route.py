"""The gRPC endpoint's route answers (``broker.frontends.grpc.route``): one address per
``Endpoints``, each queue once per node (or, for the Java and Python clients, once with every
node's address), and the address an assignment names. The official
clients' use of them is tested live in ``test_grpc_node.py``."""

from __future__ import annotations

from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.v5.client.balancer.queue_selector import QueueSelector
from rocketmq.v5.model import TopicRouteData

from broker.frontends.grpc.route import assignment_endpoints, node_endpoints, route_queues
from client.cluster.routes import GroupRoute, TopicRoute

TYPES = (pb.MessageType.NORMAL, pb.MessageType.FIFO)
GRPC = {"n0": ("10.0.0.3", 8081), "n1": ("10.0.0.1", 8082), "n2": ("10.0.0.2", 8083)}


def group(leader: str | None = "n2", grpc: dict[str, tuple[str, int]] | None = None,
          read: int = 4, write: int = 4, perm: int = 6, name: str = "a") -> GroupRoute:
    return GroupRoute(name, leader, {}, read, write, perm, 3, GRPC if grpc is None else grpc)


def addresses(endpoints: Any) -> list[tuple[str, int]]:
    return [(a.host, a.port) for a in endpoints.addresses]


def asked(*addrs: tuple[str, int]) -> Any:
    e = pb.Endpoints(scheme=pb.AddressScheme.IPv4)
    for host, port in addrs:
        e.addresses.add(host=host, port=port)
    return e


def test_each_node_is_an_endpoints_of_its_own_the_leaders_first() -> None:
    got = node_endpoints(group())
    assert [addresses(e) for e in got] == [[GRPC["n2"]], [GRPC["n1"]], [GRPC["n0"]]]
    assert {e.scheme for e in got} == {pb.AddressScheme.IPv4}
    schemes = node_endpoints(group(None, {"n0": ("broker-0.example", 8081), "n1": ("::1", 8082)}))
    assert [(addresses(e), e.scheme) for e in schemes] == [
        ([("::1", 8082)], pb.AddressScheme.IPv6),
        ([("broker-0.example", 8081)], pb.AddressScheme.DOMAIN_NAME)]
    assert node_endpoints(group(grpc={})) == []


def test_the_route_lists_each_queue_once_per_node_as_a_master_entry() -> None:
    topic = pb.Resource(name="orders")
    route = TopicRoute("orders", (group(read=4, write=2), group(grpc={}, name="b")), 0.0, True)
    queues = route_queues(topic, route, TYPES)
    assert [mq.id for mq in queues] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]  # (b: no gRPC)
    assert [addresses(mq.broker.endpoints)[0] for mq in queues[:3]] == \
        [GRPC["n2"], GRPC["n1"], GRPC["n0"]]
    assert {(mq.broker.name, mq.broker.id, mq.topic.name) for mq in queues} == {("a", 0, "orders")}
    assert all(len(mq.broker.endpoints.addresses) == 1 for mq in queues)
    assert [mq.permission for mq in queues[::3]] == [pb.Permission.READ_WRITE] * 2 + \
        [pb.Permission.READ] * 2
    assert all(list(mq.accept_message_types) == list(TYPES) for mq in queues)
    # the official Python client sends through the writable master entries: every node's
    facades = {q.endpoints.facade for q in
               QueueSelector.producer_queue_selector(TopicRouteData(queues)).all_queues()}
    assert facades == {f"ipv4:{h}:{p}" for h, p in GRPC.values()}
    read_only = route_queues(topic, TopicRoute("orders", (group(perm=4),), 0.0, True), TYPES)
    assert {mq.permission for mq in read_only} == {pb.Permission.READ}


def test_the_python_and_java_clients_get_each_queue_once_with_every_nodes_address() -> None:
    topic = pb.Resource(name="orders")
    route = TopicRoute("orders", (group(read=4, write=2),), 0.0, True)
    for language in ("PYTHON", "JAVA"):
        queues = route_queues(topic, route, TYPES, language)
        assert [mq.id for mq in queues] == [0, 1, 2, 3]
        assert [addresses(mq.broker.endpoints) for mq in queues] == \
            [[GRPC["n2"], GRPC["n1"], GRPC["n0"]]] * 4  # (the leader's first)
    # the Python client's channel: one target of every address, its pick-first policy moving
    # to the next address when a node fails (all of one family; a DNS name: one per node)
    selector = QueueSelector.producer_queue_selector(
        TopicRouteData(route_queues(topic, route, TYPES, "PYTHON")))
    assert {q.endpoints.facade for q in selector.all_queues()} == \
        {"ipv4:" + ",".join(sorted(f"{h}:{p}" for h, p in GRPC.values()))}
    named = {"n0": ("broker-0.example", 8081), "n1": ("10.0.0.1", 8082)}
    mixed = route_queues(topic, TopicRoute("orders", (group("n0", named),), 0.0, True), TYPES,
                         "PYTHON")
    assert [len(mq.broker.endpoints.addresses) for mq in mixed] == [1] * 8
    # the Node.js client (x-mq-language HTTP) and unknown ones: one entry per node
    assert len(route_queues(topic, route, TYPES, "HTTP")) == 12


def test_an_assignment_names_the_clients_access_point_when_it_is_another_node_of_the_group(
        ) -> None:
    g = group()
    # the Node.js client's request: its access point, a node other than the one asked
    assert addresses(assignment_endpoints(g, asked(GRPC["n0"]), "n2")) == [GRPC["n0"]]
    # the Python client's: the address of the entry it asked (that very node): the leader's
    assert addresses(assignment_endpoints(g, asked(GRPC["n0"]), "n0")) == [GRPC["n2"]]
    # an address not of the group, several addresses, none: the leader's
    assert addresses(assignment_endpoints(g, asked(("10.9.9.9", 1)), "n0")) == [GRPC["n2"]]
    assert addresses(assignment_endpoints(g, asked(GRPC["n0"], GRPC["n1"]), "n2")) == \
        [GRPC["n2"]]
    assert addresses(assignment_endpoints(g, asked(), "n2")) == [GRPC["n2"]]
    assert addresses(assignment_endpoints(group(leader=None), asked(), "n2")) == [GRPC["n1"]]
    assert assignment_endpoints(group(grpc={}), asked(GRPC["n0"]), "n2") is None
