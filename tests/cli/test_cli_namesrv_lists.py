"""NameServer address lists, parsed once for everyone (``;`` as RocketMQ writes them, or ``,``;
port 9876 by default): the broker's ``--namesrv`` registers through such a list, the client
library sends through one, ``dledger`` commands fall over along one. Also what a user sees when
no NameServer answers or none knows a group: a sentence and an exit code, no traceback, no
"Unclosed client session"; and the health values and their exit codes."""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import cli
from cli.common import describe
from cli.status import exit_code, group_health
from client import Message, Producer, SyncProducer
from dledger.localcluster import LocalCluster
from protocol.envelope import RemoteError
from protocol.namesrv_addrs import NameSrvAddressError, parse_namesrv_list

REGISTER_TIMEOUT_S = 30.0
DEAD = "127.0.0.1:1"  # nothing listens on port 1


def test_a_list_takes_semicolons_commas_and_the_default_port() -> None:
    assert parse_namesrv_list("a:1;b:2, c ;a:1") == ("a:1", "b:2", "c:9876")
    assert parse_namesrv_list(["localhost", "x:5;[::1]"]) == ("localhost:9876", "x:5", "[::1]:9876")
    assert parse_namesrv_list("[fe80::1]:77") == ("[fe80::1]:77",)
    for bad, says in [("", "no NameServer address"), (" ; ,", "no NameServer address"),
                      ("h:", "port must be"), ("h:0", "port must be"), ("h:65536", "port must be"),
                      ("::1", "IPv6 in brackets"), ("http://h:1", "not host or host:port"),
                      (":5", "has no host"), ("[::1", "IPv6 as [::1]:9876")]:
        with pytest.raises(NameSrvAddressError, match=says.replace("[", r"\[").replace("]", r"\]")):
            parse_namesrv_list(bad)


def test_a_bad_namesrv_option_is_a_usage_error_naming_the_entry() -> None:
    res = CliRunner().invoke(cli.main, ["status", "--namesrv", "a:1;b:x"])
    assert res.exit_code == 2 and "'b:x': the port must be 1..65535" in res.output


def test_localhost_means_the_namesrv_port_not_http_80() -> None:
    res = CliRunner().invoke(cli.main, ["topic", "list", "--namesrv", "localhost"])
    # another session may run a NameServer on 9876: then the list is simply printed
    assert res.exit_code == 0 or "localhost:9876 (" in res.output, res.output
    assert "localhost:80" not in res.output


def test_the_broker_code_is_not_said_twice() -> None:
    assert describe(RemoteError("TOPIC_NOT_FOUND", "TOPIC_NOT_FOUND")) == \
        "TopicNotFoundError: TOPIC_NOT_FOUND"
    assert describe(RemoteError("NO_PERMISSION", "NO_PERMISSION: ro is not writable")) == \
        "NoPermissionError: ro is not writable"


def test_health_values_and_their_exit_codes() -> None:
    assert group_health(3, 3, True) == "ok"
    assert group_health(3, 2, True) == "degraded"
    assert group_health(3, 2, False) == "no leader"
    assert group_health(3, 1, True) == "no quorum"
    assert group_health(4, 2, True) == "no quorum"
    rows = [{"health": h} for h in ("ok", "degraded")]
    assert exit_code(rows) == 3 and exit_code(rows[:1]) == 0
    assert exit_code([*rows, {"health": "no leader"}]) == 2


def test_a_group_with_two_of_three_nodes_stopped_has_no_quorum(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped nodes unregister: the NameServer lists only the one left, a follower. The members
    its status names make it one of three, not a quorum of one."""
    views = importlib.import_module("client.cluster.admin_views")  # (dledger status's merge lives there)

    async def one_follower(_: object, n: dict[str, str], limit: object = None,
                           scheme: str = "http", status_key: object = None) -> dict[str, object]:
        return {"node": n["node_id"], "role": "follower", "term": 4, "last_index": 9,
                "commit_index": 9, "applied_index": 9, "followers": {},
                "members": ["n0", "n1", "n2"]}

    monkeypatch.setattr(views, "node_status", one_follower)
    group = asyncio.run(views.group_status(
        None, {"group": "a", "term": 4, "nodes": [{"node_id": "n1", "admin_address": "x:1"}]}))  # type: ignore[arg-type]
    assert group["health"] == "no quorum", group
    assert [(n["node"], n["role"]) for n in group["nodes"]] == \
        [("n0", "unreachable"), ("n1", "follower"), ("n2", "unreachable")]


@pytest.mark.parametrize("command", [["send", "t", "x"], ["consume", "t"], ["topic", "status", "t"]])
def test_no_namesrv_answering_is_one_line_without_unclosed_sessions(command: list[str]) -> None:
    res = subprocess.run([sys.executable, "-c", "import cli; cli.main()", *command,
                          "--namesrv", f"{DEAD};127.0.0.1:2"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert "no NameServer answered" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert "Unclosed" not in res.stderr, res.stderr


@pytest.fixture
def namesrv() -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-m", "namesrv", "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the ready line (EOF if it died: then the test fails)
        host, port = json.loads(line)["listen"]
        yield f"{host}:{port}"
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


@pytest.mark.slow
def test_status_with_no_registered_group_is_an_error(namesrv: str) -> None:
    res = CliRunner().invoke(cli.main, ["status", "--namesrv", f"{DEAD};{namesrv}"])
    assert res.exit_code == 1 and "no broker group is registered at the NameServer" in res.output
    res = CliRunner().invoke(cli.main, ["status", "--namesrv", f"{DEAD},{namesrv}", "--json"])
    assert res.exit_code == 1


def _wait_registered(namesrv: str, group: str) -> None:
    deadline = time.monotonic() + REGISTER_TIMEOUT_S
    while True:
        with urllib.request.urlopen(f"http://{namesrv}/v1/cluster", timeout=5) as resp:
            groups = {g["group"]: g for g in json.loads(resp.read())["groups"]}
        if groups.get(group, {}).get("leader"):
            return
        assert time.monotonic() < deadline, groups
        time.sleep(0.1)  # polling the NameServer until the broker has registered


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_broker_client_and_cli_take_a_semicolon_list(namesrv: str, tmp_path: Path) -> None:
    listed = f"{DEAD};{namesrv}"
    cluster = LocalCluster(str(tmp_path), size=1, group="z",
                           program=("-m", "broker", "start", "--namesrv", listed,
                                    "--register-interval-s", "1"))
    with cluster:
        _wait_registered(namesrv, "z")

        async def send() -> str:
            async with Producer(listed) as producer:
                return (await producer.send(Message("semi", b"async"))).status
        assert asyncio.run(send()) == "SEND_OK"
        sync = SyncProducer(listed)
        try:
            assert sync.send(Message("semi", b"sync")).status == "SEND_OK"
        finally:
            sync.close()
        res = CliRunner().invoke(cli.main, ["consume", "--namesrv", listed, "--count", "semi"])
        assert res.exit_code == 0 and res.output.strip() == "2", res.output
        res = CliRunner().invoke(cli.main, ["status", "--namesrv", listed])
        assert res.exit_code == 0 and "z      health: ok" in res.output, res.output
