"""What a broker node tells the NameServer, as validated frozen values, and the parsers that build
them from untrusted JSON.

Owns the registration record (``Registration``, ``TopicRoute``), the "host:port" rule and every
input check, each failure a ``BadRequestError`` whose message names the field. Pure: no I/O, no
clock. It does not decide leadership or liveness (that is ``registry``) nor speak HTTP.
Topic names and queue/permission rules are the broker's (``protocol.topics``), so a topic the broker
accepts is one the NameServer routes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from namesrv.errors import BadRequestError
from protocol.broker_errors import InvalidTopicError
from protocol.topics import MAX_QUEUES, PERM_READ, PERM_RW, PERM_WRITE, validate_topic_name

__all__ = [
    "LEADER_ROLE", "ROLES", "Registration", "TopicRoute", "Unregistration", "parse_host_port",
    "parse_registration", "parse_topic_name", "parse_unregistration",
]

LEADER_ROLE = "leader"
# The Raft roles a node may report (dledger.raft.types.Role values).
ROLES = frozenset({"follower", "pre_candidate", "candidate", LEADER_ROLE})
PERMS = frozenset({PERM_WRITE, PERM_READ, PERM_RW})
TERM_MAX = 2**63 - 1  # terms are persisted as signed 64-bit integers
TOPICS_PER_REGISTRATION_MAX = 10_000
ID_MAX_CHARS = 64
MEMBERS_MAX = 64  # node ids in a registration's member list
ADDRESS_MAX_CHARS = 300
_ID = re.compile(r"^[A-Za-z0-9_.-]+$")  # group names and node ids


@dataclass(frozen=True, slots=True)
class TopicRoute:
    """A group's queue counts and permission (2 write, 4 read, 6 both) for one topic."""

    read_queues: int
    write_queues: int
    perm: int

    def to_json(self) -> dict[str, int]:
        return {"read_queues": self.read_queues, "write_queues": self.write_queues,
                "perm": self.perm}


@dataclass(frozen=True, slots=True)
class Registration:
    """One node's latest self-description: where to reach it, its Raft role and term, its topics."""

    group: str
    node_id: str
    client_address: str
    admin_address: str
    role: str
    term: int
    topics: Mapping[str, TopicRoute]
    # A token the node draws at start and never shows anyone but the NameServers it registers
    # with (views do not show it): only an unregister naming it removes the node ("" for a
    # caller that sends none: then node id and term must match).
    instance: str = ""
    # The group's members as this node knows them (its Raft membership: voters and learners);
    # empty from a broker that does not say. The leader's list decides which registered nodes
    # the routes show (a removed node that still runs is not routed to).
    members: tuple[str, ...] = ()
    # Where the node serves RocketMQ 5 clients (gRPC, ``broker.frontends.grpc.gateway``); "" when it
    # does not, or a broker that does not say.
    grpc_address: str = ""
    # Where the node serves RocketMQ 4.x clients (the remoting protocol,
    # ``broker.frontends.remoting``); "" when it does not.
    remoting_address: str = ""
    # The node this node knows as the leader of its ``term`` ("" none yet): a follower's word
    # is what confirms another node's leader claim (``registry``: corroboration).
    leader: str = ""
    # The queues a topic its first send creates gets (the broker's --default-queues), 0 when it
    # creates none (--no-auto-create-topics), None from a broker that does not say: what a 4.x
    # producer's stand-in route (TBW102) offers of the group (``namesrv.remoting``).
    auto_create_queues: int | None = None

    @property
    def claims_leadership(self) -> bool:
        return self.role == LEADER_ROLE


@dataclass(frozen=True, slots=True)
class Unregistration:
    """Which registration a clean shutdown removes: node id and term (and instance, if the
    registration had one) must all match it."""

    group: str
    node_id: str
    term: int
    instance: str = ""


def parse_host_port(text: object, what: str = "address",
                    allow_port_zero: bool = False) -> tuple[str, int]:
    """Split "host:port" (IPv6 as "[::1]:port"); the port is 1..65535 (0 too if allowed)."""
    if not isinstance(text, str) or not text or len(text) > ADDRESS_MAX_CHARS:
        raise BadRequestError(f"{what} must be a \"host:port\" string, not {text!r}")
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise BadRequestError(f"{what} {text!r}: write an IPv6 host in brackets, \"[::1]:port\"")
    if not sep or not host or any(c.isspace() for c in host):
        raise BadRequestError(f"{what} {text!r} is not \"host:port\"")
    if not port_text.isdigit() or len(port_text) > 5:
        raise BadRequestError(f"{what} {text!r} has no numeric port")
    port = int(port_text)
    if not (0 if allow_port_zero else 1) <= port <= 65535:
        raise BadRequestError(f"{what} {text!r}: port out of range")
    return host, port


def parse_topic_name(name: object) -> str:
    try:
        return validate_topic_name(name, allow_system=True)
    except InvalidTopicError as exc:
        raise BadRequestError(f"bad topic name: {exc}") from exc


def _dialable(text: object, what: str) -> None:
    """A registered address: host:port, and not a wildcard (a listener bound to every
    interface registers what its operator advertised, never 0.0.0.0)."""
    host, _ = parse_host_port(text, what)
    if host in ("0.0.0.0", "::"):
        raise BadRequestError(f"{what} {text!r} names every interface, not one a client can "
                              "dial: the broker must advertise an address (--advertise, "
                              "--admin-advertise)")


def parse_registration(body: object) -> Registration:
    """Build a ``Registration`` from a decoded JSON body, or name the first thing wrong with it."""
    obj = _require_object(body, "the body")
    group, node_id = _parse_id(obj, "group"), _parse_id(obj, "node_id")
    client_address = _require(obj, "client_address")
    admin_address = _require(obj, "admin_address")
    _dialable(client_address, "client_address")
    _dialable(admin_address, "admin_address")
    role = _require(obj, "role")
    if role not in ROLES:
        raise BadRequestError(f"role must be one of {sorted(ROLES)}, not {role!r}")
    term = _parse_term(obj)
    topics = _parse_topics(obj.get("topics", {}))
    grpc_address = obj.get("grpc_address", "")
    if grpc_address != "":
        _dialable(grpc_address, "grpc_address")
    remoting_address = obj.get("remoting_address", "")
    if remoting_address != "":
        _dialable(remoting_address, "remoting_address")
    leader = _parse_id(obj, "leader") if obj.get("leader", "") != "" else ""
    return Registration(group, node_id, client_address, admin_address, role, term, topics,
                        _parse_instance(obj), _parse_members(obj), grpc_address, remoting_address,
                        leader, _parse_auto_create_queues(obj))


def parse_unregistration(body: object) -> Unregistration:
    """The registration an unregister request names: group, node_id, term (and instance)."""
    obj = _require_object(body, "the body")
    return Unregistration(_parse_id(obj, "group"), _parse_id(obj, "node_id"), _parse_term(obj),
                          _parse_instance(obj))


def _parse_term(obj: Mapping[str, Any]) -> int:
    term = _require(obj, "term")
    if not _is_int(term) or not 0 <= term <= TERM_MAX:
        raise BadRequestError(f"term must be an integer 0..{TERM_MAX}, not {term!r}")
    return int(term)


def _parse_members(obj: Mapping[str, Any]) -> tuple[str, ...]:
    if "members" not in obj:
        return ()
    value = obj["members"]
    if not isinstance(value, list) or len(value) > MEMBERS_MAX:
        raise BadRequestError(f"members must be a list of at most {MEMBERS_MAX} node ids")
    return tuple(sorted(_parse_id({"member": m}, "member") for m in value))


def _parse_auto_create_queues(obj: Mapping[str, Any]) -> int | None:
    if "auto_create_queues" not in obj:
        return None
    value = obj["auto_create_queues"]
    if type(value) is not int or not 0 <= value <= MAX_QUEUES:
        raise BadRequestError(f"auto_create_queues must be an integer 0..{MAX_QUEUES}, "
                              f"not {value!r}")
    return value


def _parse_instance(obj: Mapping[str, Any]) -> str:
    if "instance" not in obj:
        return ""
    return _parse_id(obj, "instance")


def _parse_topics(value: object) -> dict[str, TopicRoute]:
    topics = _require_object(value, "topics")
    if len(topics) > TOPICS_PER_REGISTRATION_MAX:
        raise BadRequestError(f"more than {TOPICS_PER_REGISTRATION_MAX} topics in one registration")
    return {parse_topic_name(name): _parse_topic_route(name, cfg) for name, cfg in topics.items()}


def _parse_topic_route(name: str, value: object) -> TopicRoute:
    cfg = _require_object(value, f"topics[{name!r}]")
    counts = []
    for key in ("read_queues", "write_queues"):
        n = _require(cfg, key, f"topics[{name!r}].")
        if not _is_int(n) or not 0 <= n <= MAX_QUEUES:
            raise BadRequestError(f"topics[{name!r}].{key} must be an integer 0..{MAX_QUEUES}, "
                                  f"not {n!r}")
        counts.append(n)
    perm = _require(cfg, "perm", f"topics[{name!r}].")
    if not _is_int(perm) or perm not in PERMS:
        raise BadRequestError(f"topics[{name!r}].perm must be 2 (write), 4 (read) or 6 (both), "
                              f"not {perm!r}")
    return TopicRoute(counts[0], counts[1], perm)


def _parse_id(obj: Mapping[str, Any], key: str) -> str:
    value = _require(obj, key)
    if not isinstance(value, str) or not value or len(value) > ID_MAX_CHARS \
            or not _ID.match(value):
        raise BadRequestError(f"{key} must be 1..{ID_MAX_CHARS} letters, digits, '_', '.' or '-', "
                              f"not {value!r}")
    return value


def _require(obj: Mapping[str, Any], key: str, prefix: str = "") -> Any:
    if key not in obj:
        raise BadRequestError(f"missing field {prefix}{key}")
    return obj[key]


def _require_object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequestError(f"{what} must be a JSON object, not {type(value).__name__}")
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
