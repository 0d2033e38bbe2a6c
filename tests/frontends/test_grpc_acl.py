"""Access control for RocketMQ 5 clients (``--acl`` with ``--grpc-listen``): every gRPC call is
authenticated by the signature the official client makes from its ``Credentials`` and served as
that account, whose permissions are judged as our own clients' are (docs/acl.md).

Against a NameServer and a 3-node group started with ``--acl``: the unmodified PyPI client with
the right credentials sends and receives (simple and push consumers, transactions and their
check-back); a wrong secret, no credentials and a stale date-time are refused UNAUTHORIZED by
name, a missing permission FORBIDDEN, each next to the same call with the right credentials,
which succeeds; a follower forwards a call to the leader signed as the same account; nothing
refused is stored. (TLS: ``test_grpc_acl_tls.py``.)"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import grpc
import pytest
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    MessageListener,
    PushConsumer,
    SimpleConsumer,
)
from rocketmq import Message as RmqMessage
from rocketmq import Producer as RmqProducer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as sv
from rocketmq.grpc_protocol import service_pb2_grpc as sg
from rocketmq.v5.exception import ForbiddenException
from rocketmq.v5.util.signature import Signature

from broker.features.acl.model import PUB, PUB_SUB, SUB, Account
from client import Credentials as OurCredentials
from client import Message, Producer, PullConsumer
from client.cluster.routes import Routes
from dledger.client import LogClient
from protocol import broker_kinds as bp
from tests.clusters import namesrv_group
from tests.frontends.endpoints import grpc_endpoints
from tests.frontends.grpc_helpers import started
from tests.frontends.test_grpc_forwarding import _nodes
from tests.frontends.test_grpc_gateway import CommitOnCheck

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("grpc-acl")]

TOPIC, GROUP = "gacl-orders", "gacl-billing"
ROOT = OurCredentials("root", "root-secret-1")
APP = OurCredentials("app", "app-secret-12")  # PUB|SUB on the topic, SUB on the group
PUB_ONLY = OurCredentials("pubonly", "pub-secret-12")  # PUB on the topic (and SUB on the group)
SUB_ONLY = OurCredentials("subonly", "sub-secret-12")  # SUB on the topic and the group
ACCOUNTS = {
    APP: dict(topic_perms=((TOPIC, PUB_SUB),), group_perms=(
        ("%RMQ5_TXN%" + TOPIC, PUB), (GROUP, SUB))),
    PUB_ONLY: dict(topic_perms=((TOPIC, PUB),), group_perms=((GROUP, SUB),)),
    SUB_ONLY: dict(topic_perms=((TOPIC, SUB),), group_perms=((GROUP, SUB),)),
}


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(NameServer, the nodes' gRPC endpoints) of a 3-node group with --acl and accounts."""
    patch = pytest.MonkeyPatch()
    patch.setenv("DLEDGER_ACL_SECRET_ROOT", ROOT.secret_key)
    patch.setenv("DLEDGER_ACCESS_KEY", ROOT.access_key)  # (the group's routing warm-up)
    patch.setenv("DLEDGER_SECRET_KEY", ROOT.secret_key)
    try:
        with namesrv_group(tmp_path_factory.mktemp("grpc-acl"), "--grpc-listen", "127.0.0.1:0",
                           "--acl", "--acl-admin-key", "root", "--transaction-timeout-s", "1",
                           "--transaction-check-interval-s", "1") as (ns, _):
            patch.delenv("DLEDGER_ACCESS_KEY")
            patch.delenv("DLEDGER_SECRET_KEY")
            asyncio.run(put_accounts(ns))
            deadline = time.monotonic() + 30
            while grpc_endpoints(ns).count(";") < 2:
                assert time.monotonic() < deadline, "the nodes' gRPC addresses not registered"
                time.sleep(0.1)  # (polling the NameServer: a condition with a deadline)
            endpoints = grpc_endpoints(ns)
            known_everywhere(endpoints.split(";"))
            yield ns, endpoints
    finally:
        patch.undo()


async def put_accounts(ns: str, tls_ca: str | None = None) -> None:
    """The topic made (as root) and the accounts put in the group's ACL."""
    async with Producer(ns, credentials=ROOT, tls_ca=tls_ca) as root:
        await root.send(Message(TOPIC, b"seed"))
    routes = Routes(ns, credentials=ROOT, tls_ca=tls_ca)
    await routes.start()
    try:
        g = (await routes.cluster_groups())[0]
        for who, perms in ACCOUNTS.items():
            account = Account(who.access_key, who.secret_key, **perms)  # type: ignore[arg-type]
            _, answer = await routes.group_client(g).call_leader(bp.ACL_PUT, account.row())
            assert answer == "OK"
    finally:
        await routes.close()


def known_everywhere(addresses: list[str], timeout_s: float = 30) -> None:
    """Wait until every node's ACL has the accounts (a follower applies the ACL_PUT entries
    a moment after the leader answered them)."""
    deadline = time.monotonic() + timeout_s
    for address in addresses:
        with grpc.insecure_channel(address) as channel:
            stub = sg.MessagingServiceStub(channel)
            for who in ACCOUNTS:
                while stub.Heartbeat(sv.HeartbeatRequest(), timeout=5,
                                     metadata=metadata(who)).status.code != pb.Code.OK:
                    assert time.monotonic() < deadline, f"{who.access_key} unknown at {address}"
                    time.sleep(0.05)  # (polling the node: a condition with a deadline)


def config(endpoints: str, who: OurCredentials | None, secret: str | None = None
           ) -> ClientConfiguration:
    creds = Credentials() if who is None else Credentials(who.access_key,
                                                          secret or who.secret_key)
    return ClientConfiguration(endpoints, creds)


def producer(endpoints: str, who: OurCredentials | None, secret: str | None = None) -> RmqProducer:
    return started(lambda: RmqProducer(config(endpoints, who, secret), [TOPIC]))


def message(body: bytes) -> RmqMessage:
    m = RmqMessage()
    m.topic, m.body, m.tag = TOPIC, body, "T"
    return m


def consumer(endpoints: str, who: OurCredentials) -> SimpleConsumer:
    return started(lambda: SimpleConsumer(config(endpoints, who), GROUP,
                                          {TOPIC: FilterExpression("T")}, await_duration=2))


def receive_bodies(c: SimpleConsumer, want: set[bytes], timeout_s: float = 30) -> set[bytes]:
    """Receive (and ack) until every body of ``want`` came."""
    got: set[bytes] = set()
    deadline = time.monotonic() + timeout_s
    while not want <= got:
        assert time.monotonic() < deadline, f"received {sorted(got)} of {sorted(want)}"
        for m in c.receive(16, 30):
            got.add(m.body)
            c.ack(m)
    return got


class ClientLog(logging.Handler):
    """What the official client writes to its log (it logs a failed route query and raises
    only "failed to fetch topic route")."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> ClientLog:
        logging.getLogger("rocketmq-python-client").addHandler(self)
        return self

    def __exit__(self, *_: Any) -> None:
        logging.getLogger("rocketmq-python-client").removeHandler(self)


def shut(*clients: Any) -> None:
    for c in clients:
        c.shutdown()


def test_the_official_client_with_its_credentials_sends_and_receives(
        acl_cluster: tuple[str, str]) -> None:
    _, endpoints = acl_cluster
    p = producer(endpoints, APP)
    try:
        sent = {b"ok-%d" % i for i in range(5)}
        ids = [p.send(message(body)).message_id for body in sorted(sent)]
        assert all(ids)
    finally:
        p.shutdown()
    c = consumer(endpoints, APP)
    try:
        assert sent <= receive_bodies(c, sent)
    finally:
        c.shutdown()


class Until(MessageListener):  # type: ignore[misc]
    def __init__(self, body: bytes) -> None:
        self.body, self.came = body, threading.Event()

    def consume(self, message: Any) -> ConsumeResult:
        if message.body == self.body:
            self.came.set()
        return ConsumeResult.SUCCESS


def test_a_push_consumer_with_its_credentials_gets_its_settings_and_messages(
        acl_cluster: tuple[str, str]) -> None:
    """A push consumer waits for its settings on the telemetry stream and asks for its queues
    (QueryAssignment): both signed, both served as its account."""
    _, endpoints = acl_cluster
    listener = Until(b"pushed")
    c = PushConsumer(config(endpoints, APP), GROUP, listener, {TOPIC: FilterExpression("T")})
    c.startup()
    try:
        p = producer(endpoints, APP)
        try:
            p.send(message(b"pushed"))
        finally:
            p.shutdown()
        assert listener.came.wait(30), "the push consumer did not get the message"
    finally:
        c.shutdown()


def test_a_wrong_secret_or_no_credentials_are_refused_by_name(
        acl_cluster: tuple[str, str]) -> None:
    _, endpoints = acl_cluster
    for who, secret, why in ((APP, "not-the-secret", "signature does not match"),
                             (None, None, "names no access key")):
        with ClientLog() as client_log:
            p = producer(endpoints, who, secret)
            try:
                with pytest.raises(Exception, match="failed to fetch topic"):
                    p.send(message(b"refused"))
            finally:
                p.shutdown()
        # the client logs the endpoint's answer to its route query: UNAUTHORIZED and why
        named = [line for line in client_log.lines if why in line]
        assert named and str(pb.Code.UNAUTHORIZED) in named[0], client_log.lines[-5:]
    p = producer(endpoints, APP)  # the same send with the right secret
    try:
        assert p.send(message(b"right-secret")).message_id
    finally:
        p.shutdown()


def test_a_missing_permission_is_refused_forbidden(acl_cluster: tuple[str, str]) -> None:
    _, endpoints = acl_cluster
    sub_only = producer(endpoints, SUB_ONLY)
    app = producer(endpoints, APP)
    try:
        with pytest.raises(ForbiddenException, match="PUB on topic 'gacl-orders'"):
            sub_only.send(message(b"sub-only-send"))
        assert app.send(message(b"app-send")).message_id  # the same send as an account with PUB
    finally:
        shut(sub_only, app)
    pub_only = consumer(endpoints, PUB_ONLY)
    try:
        with pytest.raises(ForbiddenException, match="SUB on topic 'gacl-orders'"):
            pub_only.receive(16, 30)
    finally:
        pub_only.shutdown()
    c = consumer(endpoints, APP)  # the same receive as an account with SUB
    try:  # (one CI run got nothing within 30 s, cause not found yet: 90 s, see docs/acl.md)
        receive_bodies(c, {b"app-send"}, timeout_s=90)
    finally:
        c.shutdown()


def test_transactions_and_their_check_back_as_the_producers_account(
        acl_cluster: tuple[str, str]) -> None:
    """A transaction's half message and its end need PUB on the topic's transaction group
    ``%RMQ5_TXN%<topic>`` too; the check-back reaches the producer whose account may publish
    the topic (the gateway's heartbeats for the group are signed as that account), and its
    answer, an EndTransaction signed as the account, commits the transaction."""
    _, endpoints = acl_cluster
    checker = CommitOnCheck()
    app = started(lambda: RmqProducer(config(endpoints, APP), [TOPIC], checker))
    pub_only = started(lambda: RmqProducer(config(endpoints, PUB_ONLY), [TOPIC], CommitOnCheck()))
    try:
        with pytest.raises(ForbiddenException, match="PUB on group '%RMQ5_TXN%gacl-orders'"):
            pub_only.send(message(b"txn-denied"), pub_only.begin_transaction())
        committed = app.begin_transaction()  # the same send as an account with the group's PUB
        app.send(message(b"txn-committed"), committed)
        app.send(message(b"checked"), app.begin_transaction())  # left open: the check-back's
        committed.commit()
        c = consumer(endpoints, APP)
        try:
            receive_bodies(c, {b"txn-committed", b"checked"}, timeout_s=60)
        finally:
            c.shutdown()
        assert "checked" in checker.asked
    finally:
        shut(app, pub_only)


# -- raw calls: the metadata the official client makes, on one node's endpoint -----------------


def metadata(who: OurCredentials | None, secret: str | None = None,
             at: datetime | None = None) -> list[tuple[str, str]]:
    """The official client's metadata for ``who`` (signed with ``secret``), its date-time
    ``at`` (its clock: now) signed as the client signs it."""
    md = Signature.metadata(config("127.0.0.1:1", who, secret), "raw-client")
    if at is None or who is None:
        return list(md)
    stamp = at.strftime("%Y%m%dT%H%M%SZ")
    sign = Signature.sign(secret or who.secret_key, stamp)
    auth = (f"MQv2-HMAC-SHA1 Credential={who.access_key}, SignedHeaders=x-mq-date-time, "
            f"Signature={sign}")
    return [(k, stamp if k == "x-mq-date-time" else auth if k == "authorization" else v)
            for k, v in md]


def grpc_counts(ns: str) -> dict[str, dict[str, Any]]:
    """Each node's gRPC endpoint counts and role (its status, asked as root)."""
    async def read() -> dict[str, dict[str, Any]]:
        nodes = {nid: client for nid, (client, _) in _nodes(ns).items()}
        async with LogClient(nodes, timeout_s=5, credentials=ROOT, group="a") as client:
            return {nid: {**(st := await client.call(nid, bp.BROKER_STATUS))["grpc"],
                          "role": st["raft"]["role"]} for nid in nodes}
    return asyncio.run(read())


def raw_send(address: str, body: bytes, md: list[tuple[str, str]]) -> Any:
    with grpc.insecure_channel(address) as channel:
        m = pb.Message(body=body)
        m.topic.name = TOPIC
        m.system_properties.message_id = "01" + body.hex()[:30]
        m.system_properties.message_type = pb.MessageType.NORMAL
        m.system_properties.tag = "T"
        m.system_properties.body_encoding = pb.Encoding.IDENTITY
        return sg.MessagingServiceStub(channel).SendMessage(
            sv.SendMessageRequest(messages=[m]), timeout=10, metadata=md).status


def test_each_refusal_of_a_raw_call_and_the_same_call_signed_right(
        acl_cluster: tuple[str, str]) -> None:
    ns, _ = acl_cluster
    nodes = _nodes(ns)
    counts = grpc_counts(ns)
    leader = next(n for n, c in counts.items() if c["role"] == "leader")
    follower = next(n for n in nodes if n != leader)
    at_leader, at_follower = nodes[leader][1], nodes[follower][1]
    stale = datetime.now() - timedelta(minutes=10)
    refused = {
        "no credentials": (raw_send(at_leader, b"raw-none", metadata(None)),
                           pb.Code.UNAUTHORIZED, "names no access key"),
        "wrong secret": (raw_send(at_leader, b"raw-wrong", metadata(APP, "wrong-secret")),
                         pb.Code.UNAUTHORIZED, "signature does not match"),
        "stale": (raw_send(at_leader, b"raw-stale", metadata(APP, at=stale)),
                  pb.Code.UNAUTHORIZED, "s from this node's clock (read as UTC"),
        "no PUB": (raw_send(at_leader, b"raw-nopub", metadata(SUB_ONLY)),
                   pb.Code.FORBIDDEN, "PUB on topic 'gacl-orders'"),
        "no PUB, at a follower": (raw_send(at_follower, b"raw-nopub-f", metadata(SUB_ONLY)),
                                  pb.Code.FORBIDDEN, "PUB on topic 'gacl-orders'"),
        "stale, at a follower": (raw_send(at_follower, b"raw-stale-f", metadata(APP, at=stale)),
                                 pb.Code.UNAUTHORIZED, "from this node's clock"),
    }
    for what, (got, code, why) in refused.items():
        assert got.code == code and why in got.message, (what, got)
    # the same calls signed right, now: at the leader, and forwarded by the follower as APP
    assert raw_send(at_leader, b"raw-right", metadata(APP)).code == pb.Code.OK
    assert raw_send(at_leader, b"raw-right-at", metadata(APP, at=datetime.now())).code \
        == pb.Code.OK
    before = grpc_counts(ns)[follower]
    assert raw_send(at_follower, b"raw-right-f", metadata(APP)).code == pb.Code.OK
    after = grpc_counts(ns)[follower]
    assert after["forwarded"] > before["forwarded"]  # (the follower sent it on, signed as APP)
    assert after["unauthorized"] >= 1  # (its stale call above)

    stored = asyncio.run(bodies(ns))
    assert {b"raw-right", b"raw-right-at", b"raw-right-f"} <= stored
    assert not {b"raw-none", b"raw-wrong", b"raw-stale", b"raw-nopub", b"raw-nopub-f",
                b"raw-stale-f", b"refused", b"sub-only-send", b"txn-denied"} & stored


async def bodies(ns: str) -> set[bytes]:
    """Every message body of the topic, read as root from every queue's start."""
    out: set[bytes] = set()
    async with PullConsumer(ns, "gacl-reader", credentials=ROOT) as reader:
        for mq in await reader.fetch_queues(TOPIC):
            offset = 0
            while True:
                res = await reader.pull(mq, offset, 64)
                out.update(m.body for m in res.messages)
                if res.next_offset >= res.max_offset or not res.messages:
                    break
                offset = res.next_offset
    return out
