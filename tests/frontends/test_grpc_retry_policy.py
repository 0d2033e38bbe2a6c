"""A consumer group's retry policy (issue 35, item 2), live: set with ``dledger consumer
retry-policy`` on a 3-node group whose broker-wide default is ``--grpc-max-delivery-attempts
3``. A RocketMQ 5 client of the group is told it in its settings (``backoff_policy.max_attempts``,
read here from the raw telemetry stream, on every node), and a message never acked goes to the
group's dead-letter queue after that many deliveries, while another group keeps the default.
The setting survives a leader kill: the new leader shows it, tells it, and dead-letters by it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from rocketmq import ClientConfiguration, Credentials
from rocketmq import Message as RmqMessage
from rocketmq import Producer as RmqProducer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as sv
from rocketmq.grpc_protocol import service_pb2_grpc as sg

import cli
from tests.clusters import namesrv_group
from tests.frontends.endpoints import grpc_endpoints, node_grpc_endpoints
from tests.frontends.grpc_helpers import read_all, simple_consumer, started
from tests.frontends.test_grpc_failover import kill_the_leader, wait_for

pytestmark = pytest.mark.slow

TOPIC = "doomed-per-group"


def retry_policy(ns: str, *args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli.main, ["consumer", "retry-policy", "--namesrv", ns, *args])
    return res.exit_code, res.output


def told_attempts(endpoint: str, group: str) -> int:
    """What a simple consumer of ``group`` is told at ``endpoint``: its settings' max attempts."""
    cmd = sv.TelemetryCommand()
    cmd.settings.client_type = pb.ClientType.SIMPLE_CONSUMER
    cmd.settings.subscription.group.name = group
    with grpc.insecure_channel(endpoint) as channel:
        stream = sg.MessagingServiceStub(channel).Telemetry(
            iter([cmd]), timeout=5, metadata=[("x-mq-client-id", f"policy-{group}")])
        reply = next(stream)
        stream.cancel()
    assert reply.status.code == pb.Code.OK, reply.status
    return int(reply.settings.backoff_policy.max_attempts)


def send_one(endpoints: str, body: bytes) -> str:
    producer = started(lambda: RmqProducer(ClientConfiguration(endpoints, Credentials()), [TOPIC]))
    try:
        m = RmqMessage()
        m.topic, m.body = TOPIC, body
        return str(producer.send(m).message_id)
    finally:
        producer.shutdown()


def deliveries_until_dead(endpoints: str, group: str, body: bytes, attempts: int) -> list[int]:
    """The delivery attempts of ``body`` to ``group``, never acked, until it stops coming (a
    receive long-polls past its next invisible time and finds it gone to the DLQ)."""
    consumer = simple_consumer(endpoints, group, TOPIC, await_s=3)
    try:
        seen: list[int] = []
        for _ in range(attempts + 16):  # bounded: the receives the test allows
            try:
                received = consumer.receive(16, 1)
            except grpc.aio.AioRpcError as err:  # sent to a node that is down: ask again
                if err.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                continue
            got = [m.delivery_attempt for m in received if m.body == body]
            if not got and len(seen) >= attempts:
                break
            seen += got
        return seen
    finally:
        consumer.shutdown()


def dead_bodies(ns: str, group: str, count: int) -> list[bytes]:
    return [m.body for m in asyncio.run(read_all(ns, f"%DLQ%{group}", count))]


def test_a_groups_retry_policy_is_told_used_and_survives_a_leader_kill(tmp_path: Path) -> None:
    with namesrv_group(tmp_path, "--grpc-listen", "127.0.0.1:0",
                       "--grpc-max-delivery-attempts", "3") as (ns, cluster):
        wait_for(lambda: grpc_endpoints(ns).count(";") == 2, 30, "the gRPC endpoints")
        endpoints = grpc_endpoints(ns)
        code, out = retry_policy(ns, "two-group", "--max-delivery-attempts", "2")
        assert code == 0 and out == "a: two-group: max delivery attempts 2\n", out
        code, out = retry_policy(ns, "three-group")
        assert out == "a: three-group: max delivery attempts 3 (the broker's default)\n", out
        for endpoint in endpoints.split(";"):  # every node, once it has applied the setting
            wait_for(lambda e=endpoint: told_attempts(e, "two-group") == 2, 10,  # type: ignore[misc]
                     f"{endpoint} to tell the setting")
            assert told_attempts(endpoint, "three-group") == 3

        send_one(endpoints, b"poison-1")
        assert deliveries_until_dead(endpoints, "two-group", b"poison-1", 2) == [1, 2]
        assert deliveries_until_dead(endpoints, "three-group", b"poison-1", 3) == [1, 2, 3]
        assert dead_bodies(ns, "two-group", 1) == [b"poison-1"]
        assert dead_bodies(ns, "three-group", 1) == [b"poison-1"]

        by_node = node_grpc_endpoints(ns)
        victim = kill_the_leader(cluster)
        wait_for(lambda: retry_policy(ns, "two-group")[0] == 0, 60, "a new leader to answer")
        assert retry_policy(ns, "two-group")[1] == "a: two-group: max delivery attempts 2\n"
        alive = [e for n, e in sorted(by_node.items()) if n != victim]
        assert all(told_attempts(e, "two-group") == 2 for e in alive)
        send_one(";".join(alive), b"poison-2")
        assert deliveries_until_dead(";".join(alive), "two-group", b"poison-2", 2) == [1, 2]
        assert dead_bodies(ns, "two-group", 2) == [b"poison-1", b"poison-2"]

        code, out = retry_policy(ns, "two-group", "--default")
        assert code == 0 and out == "a: two-group: max delivery attempts 3 (the broker's default)\n"
        code, out = retry_policy(ns, "--json")
        assert code == 0 and '"groups": []' in out
