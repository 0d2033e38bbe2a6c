"""The deployment run for real (issue 36): deploy/build-image.sh builds the image with no registry
(a debootstrap base, a wheelhouse built on the host), podman-compose starts deploy/compose.yaml
(a NameServer and two groups of three) under a project name of its own with ports chosen free,
and everything below is checked from this host through the published ports: `dledger status`,
the containers' health checks, sends and consumes with our client, a leader's container
SIGKILLed (a new leader, no acknowledged message lost) and started again on its volume (it
catches up), a node stopped with SIGTERM (its checkpoint written on the way out), and the
containers' logs (JSON lines on stdout with group, node and term).

Needs podman, runc, debootstrap and podman-compose, as root (.ci/run installs them): with
CI=true a missing engine fails the test, elsewhere it skips with the reason. The tests share
one cluster and run in order (one module: one xdist worker)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.machine.state import BrokerState
from broker.shell.checkpoint import CHECKPOINT_FILE
from client import ClientError, Message, Producer, PullConsumer, UnavailableError
from protocol.cluster_key import CLUSTER_KEY_ENV
from tests.deploy.containers import (
    BROKERS,
    Built,
    ComposeCluster,
    build_image,
    compose_cluster,
    missing_engine,
    podman,
    require_engine,
)
from tests.deploy.kube import render_group
from tests.nodes.test_processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TOPIC = "deployed"
QUEUES = 4
READY_DEADLINE_S = 180.0  # seven containers start, two groups elect and register
LEADER_DEADLINE_S = 60.0
CATCH_UP_DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def built() -> Iterator[Built]:
    require_engine(missing_engine())
    tag = f"localhost/dledger:test-{secrets.token_hex(4)}"
    try:
        yield build_image(tag)
    finally:
        podman("rmi", "-f", tag, check=False)


@pytest.fixture(scope="module")
def cluster(built: Built) -> Iterator[ComposeCluster]:
    with compose_cluster(built.tag) as c:
        yield c


def test_a_missing_engine_fails_under_ci_and_skips_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda tool: None if tool == "runc" else f"/usr/bin/{tool}")
    reason = missing_engine()
    assert reason == "no container engine: runc is not installed (apt-get install runc; .ci/run does)"
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true and no container engine: runc"):
        require_engine(reason)
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="runc is not installed"):
        require_engine(reason)
    require_engine(None)


def status(c: ComposeCluster) -> tuple[int, list[dict[str, Any]]]:
    """`dledger status --json` from this host: its exit code and its groups."""
    done = subprocess.run([sys.executable, "-m", "cli", "status", "--namesrv", c.namesrv, "--json"],
                          env={**os.environ, CLUSTER_KEY_ENV: c.cluster_key}, capture_output=True,
                          text=True, timeout=60, check=False)
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        return done.returncode, []


def group_of(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next((g for g in rows if g["group"] == name), {"leader": None, "health": "absent", "nodes": []})


async def healthy(c: ComposeCluster, deadline_s: float) -> list[dict[str, Any]]:
    seen: list[list[dict[str, Any]]] = [[]]

    def ok() -> bool:
        code, rows = status(c)
        seen[0] = rows
        return code == 0 and sorted(g["group"] for g in rows) == ["a", "b"] and all(
            g["health"] == "ok" and len(g["nodes"]) == 3 for g in rows)
    await wait_until(ok, deadline_s, "dledger status: groups a and b healthy")
    return seen[0]


def test_the_image_is_built_offline_and_runs_as_its_unprivileged_user(
        built: Built, ran: Callable[[str], None]) -> None:
    ran(f"build-image.sh took {built.seconds:.0f} s:\n{built.output}")
    assert "MiB" in built.output.splitlines()[-1]
    assert podman("run", "--rm", built.tag, "id", "-u").strip() == "10001"
    info = json.loads(podman("image", "inspect", built.tag))[0]
    assert info["Config"]["User"] == "10001:10001"
    assert podman("run", "--rm", built.tag, "dledger-broker", "--help").count("start") >= 1


def test_the_cluster_comes_up_healthy_from_the_host(cluster: ComposeCluster,
                                                    ran: Callable[[str], None]) -> None:
    t0 = time.monotonic()
    rows = asyncio.run(healthy(cluster, READY_DEADLINE_S))
    ran(f"healthy in {time.monotonic() - t0:.0f} s; leaders "
        + ", ".join(f"{g['group']}: {g['leader']} (term {g['term']})" for g in rows)
        + "".join(f"\nstarted on attempt {len(cluster.refused_starts) + 1}; refused before: {e}"
                  for e in cluster.refused_starts[:1]))
    containers = cluster.containers()
    assert sorted(containers) == sorted(("namesrv", *BROKERS))
    for service, cid in containers.items():  # the images' health checks, as the engine runs them
        done = subprocess.run(["podman", "healthcheck", "run", cid], env=cluster.env(),
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, f"{service}: health check: {done.stdout} {done.stderr}"
        state = cluster.state(service)
        health = state.get("Health") or state.get("Healthcheck") or {}
        assert isinstance(health, dict) and health.get("Status") == "healthy", (service, state)


async def _send(c: ComposeCluster, count: int, prefix: str, acked: dict[bytes, str] | None = None,
                stop: asyncio.Event | None = None) -> dict[bytes, str]:
    """Up to ``count`` messages to TOPIC, one after another (until ``stop`` is set, if given);
    the acknowledged ones, body -> group (into ``acked`` as they come, when given)."""
    acked = {} if acked is None else acked
    async with Producer(c.namesrv, send_timeout_s=10.0) as p:
        for k in range(count):
            if stop is not None and stop.is_set():
                break
            body = f"{prefix}-{k:06d}".encode()
            try:
                res = await p.send(Message(TOPIC, body))
            except (ClientError, UnavailableError):
                continue  # an outcome unknown: not counted as acknowledged
            acked[body] = res.queue.group
    return acked


async def _consume_all(c: ComposeCluster) -> set[bytes]:
    got: set[bytes] = set()
    async with PullConsumer(c.namesrv, "deploy-check", timeout_s=10.0) as consumer:
        for mq in await consumer.fetch_queues(TOPIC):
            offset = 0
            for _ in range(10_000):  # bounded: a queue holds far fewer batches
                res = await consumer.pull(mq, offset, max_messages=256)
                got.update(m.body for m in res.messages)
                if res.next_offset >= res.max_offset:
                    break
                offset = res.next_offset
    return got


def test_sends_and_consumes_through_the_published_ports(cluster: ComposeCluster) -> None:
    asyncio.run(healthy(cluster, READY_DEADLINE_S))
    done = subprocess.run([sys.executable, "-m", "cli", "topic", "create", TOPIC, "--queues", str(QUEUES),
                           "--namesrv", cluster.namesrv],
                          env={**os.environ, CLUSTER_KEY_ENV: cluster.cluster_key},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    # each group registers the new topic at its next registration: sent once both are routed
    # (a producer reading the route before group a's arrives sends to b alone, as CI saw)
    asyncio.run(wait_until(lambda: _routed_groups(cluster) == {"a", "b"}, READY_DEADLINE_S,
                           f"{TOPIC} routed on groups a and b"))
    acked = asyncio.run(_send(cluster, 200, "first"))
    assert len(acked) == 200 and set(acked.values()) == {"a", "b"}
    assert set(acked) <= asyncio.run(_consume_all(cluster))


def _routed_groups(c: ComposeCluster) -> set[str]:
    """The groups the NameServer routes TOPIC to (none while it routes it nowhere)."""
    try:
        with urllib.request.urlopen(f"http://{c.namesrv}/v1/topics/{TOPIC}/route",
                                    timeout=5) as resp:
            return {g["group"] for g in json.loads(resp.read())["groups"]}
    except OSError:  # (urllib's HTTPError, 404 before any group registered it, is one)
        return set()


def _node_row(rows: list[dict[str, Any]], group: str, node: str) -> dict[str, Any]:
    return next((n for n in group_of(rows, group)["nodes"] if n["node"] == node), {"role": "absent"})


def test_killing_the_leaders_container_loses_no_acknowledged_message_and_it_catches_up(
        cluster: ComposeCluster, ran: Callable[[str], None]) -> None:
    rows = asyncio.run(healthy(cluster, READY_DEADLINE_S))
    old = group_of(rows, "a")["leader"]
    service = f"a{old.removeprefix('n')}"
    acked: dict[bytes, str] = {}

    async def scenario() -> str:
        """Sends run from before the kill until group a's new leader has acknowledged 20."""
        stop = asyncio.Event()
        sender = asyncio.ensure_future(_send(cluster, 100_000, "kill", acked, stop))
        await wait_until(lambda: sender.done() or len(acked) >= 50, 60, "sends under way")
        await asyncio.to_thread(podman, "kill", "--signal", "KILL", cluster.containers()[service])
        new: list[str] = []

        async def elected() -> bool:
            _code, now = await asyncio.to_thread(status, cluster)  # (the sends go on meanwhile)
            leader = group_of(now, "a")["leader"]
            new[:] = [leader] if leader not in (None, old) else []
            return bool(new)
        await wait_until(elected, LEADER_DEADLINE_S, f"a new leader of group a after {old}")
        before = sum(g == "a" for g in acked.values())
        await wait_until(lambda: sender.done() or sum(g == "a" for g in acked.values()) >= before + 20,
                         LEADER_DEADLINE_S, "sends acknowledged by group a's new leader")
        stop.set()
        await sender
        assert sum(g == "a" for g in acked.values()) >= before + 20, "the sends to group a stopped"
        return new[0]
    new_leader = asyncio.run(scenario())
    # the restart policy may have brought it back already; else start it as an operator would
    restarted_by_policy = bool(cluster.state(service).get("Running"))
    if not restarted_by_policy:
        podman("start", cluster.containers()[service])

    def caught_up() -> bool:
        _code, now = status(cluster)
        leader = _node_row(now, "a", group_of(now, "a")["leader"] or "")
        node = _node_row(now, "a", old)
        return bool(node["role"] == "follower" and leader["role"] == "leader"
                    and node["applied_index"] >= leader["commit_index"])
    asyncio.run(wait_until(caught_up, CATCH_UP_DEADLINE_S, f"{old} of group a caught up"))
    # it came back on its volume: the same named volume on /data, and it started from the term
    # it had (a node on an empty disk starts at term 0)
    mounts = json.loads(podman("inspect", "--format", "{{json .Mounts}}", cluster.containers()[service]))
    assert [(m["Name"], m["Destination"]) for m in mounts] == [(f"{cluster.project}_{service}-data", "/data")]
    lines = [json.loads(line) for line in podman("logs", cluster.containers()[service]).splitlines()]
    starts = [i for i, e in enumerate(lines) if " starting (pid " in e.get("msg", "")]
    assert len(starts) == 2, f"{service} started {len(starts)} times"
    first = next(e for e in lines[starts[1]:] if e.get("msg", "").startswith("at term "))
    assert first["term"] >= 1, first
    missing = set(acked) - asyncio.run(_consume_all(cluster))
    ran(f"killed {old} ({service}); new leader {new_leader}; {len(acked)} acknowledged, "
        f"{len(missing)} lost; restarted by the restart policy: {restarted_by_policy}")
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:3]}"


def _admin_status(c: ComposeCluster, service: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{c.admin(service)}/status", timeout=5) as resp:
        body: dict[str, Any] = json.loads(resp.read())
    return body


def test_sigterm_stops_a_node_which_writes_its_checkpoint(cluster: ComposeCluster) -> None:
    rows = asyncio.run(healthy(cluster, READY_DEADLINE_S))
    b = group_of(rows, "b")
    follower = next(n["node"] for n in b["nodes"] if n["node"] != b["leader"])
    service = f"b{follower.removeprefix('n')}"
    assert "b" in asyncio.run(_send(cluster, 100, "term")).values()

    def applied_everything() -> bool:
        _code, now = status(cluster)
        leader = _node_row(now, "b", group_of(now, "b")["leader"] or "")
        node = _node_row(now, "b", follower)
        return bool(leader["role"] == "leader" and node.get("applied_index", -1) >= leader["commit_index"])
    asyncio.run(wait_until(applied_everything, CATCH_UP_DEADLINE_S, f"{follower} applied all"))
    applied = _admin_status(cluster, service)["raft"]["applied_index"]
    podman("stop", "--time", "30", cluster.containers()[service], timeout_s=90)
    state = cluster.state(service)
    assert state["Running"] is False and state["ExitCode"] == 0, state
    logs = podman("logs", cluster.containers()[service])
    assert "stopped (SIGTERM)" in logs
    raw = (cluster.volume_path(service) / "node" / CHECKPOINT_FILE).read_bytes()
    assert BrokerState.applied_of(memoryview(raw)[4:]) >= applied
    podman("start", cluster.containers()[service])


def test_the_containers_log_json_lines_on_stdout_with_group_node_and_term(
        cluster: ComposeCluster) -> None:
    for service, cid in cluster.containers().items():
        done = subprocess.run(["podman", "logs", cid], env=cluster.env(), capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0 and done.stderr == "", (service, done.stderr[-500:])
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        logged = [e for e in lines if "level" in e]  # (and the ready line)
        assert len(logged) >= 2, service
        if service == "namesrv":
            continue
        assert any(e.get("event") == "ready" for e in lines), service
        for e in lines:
            assert {"group", "node", "term"} <= set(e), (service, e)
            assert e["group"] == service[0] and e["node"] == f"n{service[1]}", (service, e)
        assert any(isinstance(e["term"], int) and e["term"] >= 1 for e in lines), service


def _kube_network() -> tuple[str, str]:
    """A podman network of this test's own on a subnet no other network holds."""
    name = f"dledger-kube-{secrets.token_hex(4)}"
    for _ in range(20):  # bounded: a taken subnet is refused, try another
        subnet = f"10.{secrets.choice(range(100, 250))}.{secrets.randbelow(250)}.0/24"
        if podman("network", "create", "--subnet", subnet, name, check=False).strip():
            return name, subnet
    raise AssertionError("no free subnet for the kube play network")


def test_one_group_of_the_kubernetes_manifests_elects_a_leader_under_kube_play(
        built: Built, tmp_path: Path, ran: Callable[[str], None]) -> None:
    suffix = f"-t{secrets.token_hex(3)}"
    network, subnet = _kube_network()
    text, ips, addresses = render_group("dledger-a", built.tag, secrets.token_hex(32), subnet, suffix)
    play = tmp_path / "group-a.yaml"
    play.write_text(text)
    try:
        podman("kube", "play", "--network", network, *[f"--ip={ip}" for ip in ips], str(play),
               timeout_s=300)
        pods = [p for p in addresses if p != "dledger-namesrv"]
        seen: dict[str, dict[str, Any]] = {}

        def elected() -> bool:
            for pod in pods:
                try:
                    with urllib.request.urlopen(f"http://{addresses[pod]}:8080/status", timeout=2) as r:
                        seen[pod] = json.loads(r.read())["raft"]
                except OSError:
                    seen.pop(pod, None)
            roles = sorted(s["role"] for s in seen.values())
            terms = {s["term"] for s in seen.values()}
            return roles == ["follower", "follower", "leader"] and len(terms) == 1
        asyncio.run(wait_until(elected, READY_DEADLINE_S, "a leader among the played pods"))
        ns = addresses["dledger-namesrv"]

        def registered() -> bool:
            with urllib.request.urlopen(f"http://{ns}:9876/v1/cluster", timeout=2) as r:
                groups = json.loads(r.read())["groups"]
            return [(g["group"], len(g["nodes"])) for g in groups] == [("a", 3)]
        asyncio.run(wait_until(registered, READY_DEADLINE_S, "group a registered at the NameServer"))
        ran("kube play: " + ", ".join(f"{p} {s['role']}" for p, s in sorted(seen.items())))
    finally:
        podman("kube", "down", str(play), timeout_s=300, check=False)
        claims = [d["metadata"]["name"] for d in yaml.safe_load_all(text)
                  if d["kind"] == "PersistentVolumeClaim"]
        podman("volume", "rm", "-f", *claims, check=False)
        podman("network", "rm", "-f", network, check=False)
