"""A broker node's configuration (``BrokerConfig``, checked when made) and the seeded bugs a test
may turn on (``BROKER_CANARIES``: each feature's own set)."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.core.cq_files import QUEUE_CANARIES
from broker.core.sendwire import SCOPE_CANARIES
from broker.core.state import DEDUP_CANARIES
from broker.features.acl.model import ACL_CANARIES
from broker.features.delay.model import DEFAULT_LEVELS, DEFAULT_MAX_DELAY_MS, DELAY_CANARIES, parse_levels
from broker.features.orderly.model import ORDERLY_CANARIES
from broker.features.pop.model import POP_CANARIES, POP_LEADER_CANARIES
from broker.features.query.index import IndexConfig
from broker.features.retry.model import RETRY_CANARIES
from broker.features.txn.model import TXN_CANARIES
from dledger.node.config import Address, NodeConfig
from protocol.auth import REPLAY_WINDOW_MS_DEFAULT, Credentials
from protocol.broker_kinds import MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES_CEILING
from protocol.framed import CONNECTIONS_MAX_DEFAULT, INPUT_BUFFER_BYTES_MAX_DEFAULT
from protocol.topics import DEFAULT_QUEUES, MAX_QUEUES

__all__ = ["BROKER_CANARIES", "GRPC_CANARIES", "REMOTING_CANARIES", "WILDCARD_HOSTS", "BrokerConfig"]

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})  # bind every interface: no one dials it

# Every seeded bug a test may turn on: each feature's own set.
# "remoting_ack_early": the remoting endpoint answers a 4.x send SUCCESS at once and stores it a
# second later (broker.frontends.remoting.sends); the 4.x chaos scenario's checker must find the
# sends a leader kill took before they were stored lost
REMOTING_CANARIES = frozenset({"remoting_ack_early"})
# "grpc_batch_torn": the gRPC endpoint stores a batch's first half alone and answers the send as
# failed (broker.frontends.grpc.sends); the batch checker must find the batch torn
GRPC_CANARIES = frozenset({"grpc_batch_torn"})
BROKER_CANARIES = (DELAY_CANARIES | ORDERLY_CANARIES | TXN_CANARIES | POP_CANARIES
                   | POP_LEADER_CANARIES | RETRY_CANARIES | ACL_CANARIES | QUEUE_CANARIES
                   | REMOTING_CANARIES | GRPC_CANARIES | DEDUP_CANARIES | SCOPE_CANARIES)


@dataclass(frozen=True)
class BrokerConfig:
    node: NodeConfig
    client_listen: Address = ("127.0.0.1", 0)
    auto_create_topics: bool = True
    default_queues: int = DEFAULT_QUEUES  # of a topic created by its first send
    max_message_bytes: int = MAX_MESSAGE_BYTES  # of a message, or of a batch (SEND) in total
    send_timeout_s: float = 3.0
    admin_listen: Address | None = ("127.0.0.1", 0)  # None: no admin HTTP
    checkpoint_interval_s: float = 10.0  # persist the state machine this often (0: never)
    namesrv: tuple[str, ...] = ()  # NameServer addresses (host:port) to register with
    register_interval_s: float = 30.0
    # Tell a consumer group's members when its members or their subscriptions change (RocketMQ's
    # notifyConsumerIdsChangedEnable): CONSUMER_IDS_CHANGED, or 4.x's NOTIFY_CONSUMER_IDS_CHANGED
    notify_consumers: bool = True
    # Addresses told to NameServers instead of the bound ones (NAT, a proxy, every interface
    # bound); port 0: the bound port. The gRPC listener takes advertise_client's host, and so
    # does the admin one when bound to every interface (``registered``).
    advertise_client: Address | None = None
    advertise_admin: Address | None = None
    max_connections: int = CONNECTIONS_MAX_DEFAULT  # client connections open at once
    input_buffer_bytes_max: int = INPUT_BUFFER_BYTES_MAX_DEFAULT  # partial frames, all clients
    delay_levels_ms: tuple[int, ...] = parse_levels(DEFAULT_LEVELS)  # RocketMQ's 18 levels
    max_delay_ms: int = DEFAULT_MAX_DELAY_MS  # the furthest ahead a timed message may be due
    # Transactions' check-back (RocketMQ's transactionTimeout / CheckInterval / CheckMax)
    transaction_timeout_s: float = 6.0
    transaction_check_interval_s: float = 60.0
    transaction_check_max: int = 15
    canaries: frozenset[str] = frozenset()  # seeded broker bugs (BROKER_CANARIES), tests only
    index: IndexConfig = field(default_factory=IndexConfig)  # the key index's files
    grpc_listen: Address | None = None  # serve RocketMQ 5 clients here (broker.frontends.grpc.gateway)
    remoting_listen: Address | None = None  # serve RocketMQ 4.x clients here (broker.frontends.remoting)
    grpc_max_delivery_attempts: int = 16  # a gRPC consumer's deliveries of a message before DLQ
    acl: bool = False  # access control: every request signed and checked (broker.features.acl.service)
    acl_admins: tuple[Credentials, ...] = ()  # bootstrap admin accounts (not in the log)
    # The cluster credential registrations are signed with (protocol.cluster_key); None: sent
    # unsigned (only a NameServer started --insecure takes them). Never shown by repr.
    cluster_key: bytes | None = field(default=None, repr=False)
    protect_status: bool = False  # /status answers only reads signed with cluster_key
    acl_replay_window_ms: int = REPLAY_WINDOW_MS_DEFAULT  # a signature's clock vs this node's

    def __post_init__(self) -> None:
        unknown = self.canaries - BROKER_CANARIES
        if unknown:
            raise ValueError(f"unknown broker canaries {sorted(unknown)}")
        if self.canaries and not self.node.test_faults:
            raise ValueError("broker canaries need test_faults=True")
        if not self.delay_levels_ms or min(self.delay_levels_ms) <= 0:
            raise ValueError("delay levels are positive durations, at least one")
        if not 1 <= self.default_queues <= MAX_QUEUES:
            raise ValueError(f"default_queues must be 1..{MAX_QUEUES}, not {self.default_queues}")
        if not (self.transaction_timeout_s > 0 and self.transaction_check_interval_s > 0
                and self.transaction_check_max >= 0):
            raise ValueError("transaction timeout and check interval are positive, the check "
                             "count at least 0")
        if self.protect_status and self.cluster_key is None:
            raise ValueError("--protect-status needs the cluster credential (--cluster-key-file "
                             "or $DLEDGER_CLUSTER_KEY): its readers sign with it")
        if self.acl_replay_window_ms < 1000:
            raise ValueError("the replay window is at least 1000 ms (clocks differ)")
        if self.grpc_listen is not None and not self.namesrv:
            raise ValueError("the gRPC endpoint routes through the NameServers: give --namesrv")
        if self.grpc_listen is not None and self.cluster_key is None:
            raise ValueError("the gRPC endpoint signs the receipt and recall handles it gives "
                             "clients with the cluster credential (so that every node verifies "
                             "them): give --cluster-key-file or $DLEDGER_CLUSTER_KEY")
        if self.remoting_listen is not None and not self.namesrv:
            raise ValueError("the remoting endpoint routes through the NameServers: give --namesrv")
        self._check_advertised()
        if not 1 <= self.max_message_bytes <= MAX_MESSAGE_BYTES_CEILING:
            raise ValueError(f"max_message_bytes must be 1..{MAX_MESSAGE_BYTES_CEILING}, "
                             f"not {self.max_message_bytes}")

    def _check_advertised(self) -> None:
        """An advertised address is one to dial, not a wildcard; and with NameServers, a
        listener bound to every interface has no address they could hand out: refused unless
        an advertised one is given."""
        def every(address: Address | None) -> bool:
            return address is not None and address[0] in WILDCARD_HOSTS
        for option, advertised in (("--advertise", self.advertise_client),
                                   ("--admin-advertise", self.advertise_admin)):
            if every(advertised):
                raise ValueError(f"{option} {_fmt(advertised)} is every interface, not an "
                                 "address to dial")
        if not self.namesrv:
            return  # nothing is registered
        if every(self.client_listen) and self.advertise_client is None:
            raise ValueError(f"--listen {_fmt(self.client_listen)} binds every interface, which "
                             "no client can dial: give --advertise HOST:PORT, the address the "
                             "NameServers hand to clients")
        if every(self.grpc_listen) and self.advertise_client is None:
            raise ValueError(f"--grpc-listen {_fmt(self.grpc_listen)} binds every interface: "
                             "give --advertise HOST:PORT (the gRPC endpoint is registered at its "
                             "host)")
        if every(self.remoting_listen) and self.advertise_client is None:
            raise ValueError(f"--remoting-listen {_fmt(self.remoting_listen)} binds every "
                             "interface: give --advertise HOST:PORT (the remoting endpoint is "
                             "registered at its host)")
        if every(self.admin_listen) and self.advertise_admin is None \
                and self.advertise_client is None:
            raise ValueError(f"--admin-listen {_fmt(self.admin_listen)} binds every interface, "
                             "which the NameServers and the console cannot dial: give "
                             "--admin-advertise HOST:PORT (or --advertise, whose host it takes)")

    def registered(self, listener: str, bound: Address) -> Address:
        """The address to register for ``listener`` ("client", "admin", "grpc" or "remoting")
        bound at ``bound``: its advertised one (a port 0 there is the bound port), else the
        bound port at ``advertise_client``'s host (the clients' listeners always, the admin one
        when bound to every interface), else the bound address."""
        advertised = self.advertise_admin if listener == "admin" else None
        if advertised is None and (listener != "admin" or bound[0] in WILDCARD_HOSTS):
            advertised = self.advertise_client
            if advertised is not None and listener != "client":
                advertised = (advertised[0], 0)
        if advertised is None:
            return bound
        return advertised[0], advertised[1] or bound[1]


def _fmt(address: Address | None) -> str:
    return f"{address[0]}:{address[1]}" if address else ""
