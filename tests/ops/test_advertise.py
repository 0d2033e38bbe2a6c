"""Advertised addresses: what a broker registers with the NameServers for each of its listeners
(client, admin, gRPC). ``--advertise HOST[:PORT]`` and ``--admin-advertise HOST[:PORT]`` (a host
alone keeps the bound port); a listener bound to every interface is refused unless an address
is advertised for it, by the broker's configuration, its command line and the NameServer alike
(a registered 0.0.0.0 is an address no client can dial). Live: a group advertising a host name
is reached through the NameServer at that name, and the console reads its nodes there."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from broker.cli import main
from broker.config import BrokerConfig
from client import Message, Producer, PullConsumer
from dledger.node.runtime import NodeConfig
from tests.clusters import console_ok, namesrv_group

NS = ("127.0.0.1:9876",)


def _config(tmp_path: Path, **kw: object) -> BrokerConfig:
    node = NodeConfig(group="g", node_id="n0", peers={"n0": ("127.0.0.1", 1)},
                      data_dir=str(tmp_path))
    kw.setdefault("cluster_key", b"k" * 32)  # (the gRPC endpoint signs its handles with it)
    return BrokerConfig(node, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("kw, option", [
    ({"client_listen": ("0.0.0.0", 10911)}, "--advertise"),
    ({"client_listen": ("::", 10911)}, "--advertise"),
    ({"admin_listen": ("0.0.0.0", 8080)}, "--admin-advertise"),
    ({"grpc_listen": ("0.0.0.0", 8081)}, "--advertise"),
])
def test_a_listener_on_every_interface_needs_an_advertised_address(
        tmp_path: Path, kw: dict[str, object], option: str) -> None:
    with pytest.raises(ValueError, match=option):
        _config(tmp_path, namesrv=NS, **kw)
    if "grpc_listen" not in kw:  # (which needs NameServers)
        _config(tmp_path, **kw)  # without NameServers nothing is registered: nothing to dial
    _config(tmp_path, namesrv=NS, advertise_client=("h", 0), advertise_admin=("h", 0), **kw)


def test_an_advertised_address_is_not_a_wildcard_either(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--advertise 0\.0\.0\.0:0 is every interface"):
        _config(tmp_path, namesrv=NS, advertise_client=("0.0.0.0", 0))
    with pytest.raises(ValueError, match="--admin-advertise"):
        _config(tmp_path, namesrv=NS, advertise_admin=("::", 80))


def test_each_listener_registers_its_advertised_or_bound_address(tmp_path: Path) -> None:
    plain = _config(tmp_path, namesrv=NS)
    assert plain.registered("client", ("127.0.0.1", 5)) == ("127.0.0.1", 5)
    assert plain.registered("admin", ("127.0.0.1", 6)) == ("127.0.0.1", 6)
    host_only = _config(tmp_path, namesrv=NS, client_listen=("0.0.0.0", 0),
                        admin_listen=("0.0.0.0", 0), advertise_client=("broker-a0", 0))
    assert host_only.registered("client", ("0.0.0.0", 10911)) == ("broker-a0", 10911)
    assert host_only.registered("grpc", ("0.0.0.0", 8081)) == ("broker-a0", 8081)
    assert host_only.registered("admin", ("0.0.0.0", 8080)) == ("broker-a0", 8080)
    assert host_only.registered("admin", ("10.0.0.5", 8080)) == ("10.0.0.5", 8080)  # bound: as is
    nat = _config(tmp_path, namesrv=NS, advertise_client=("203.0.113.7", 30911),
                  advertise_admin=("ops.example", 0))
    assert nat.registered("client", ("127.0.0.1", 10911)) == ("203.0.113.7", 30911)
    assert nat.registered("grpc", ("127.0.0.1", 8081)) == ("203.0.113.7", 8081)
    assert nat.registered("admin", ("127.0.0.1", 8080)) == ("ops.example", 8080)
    v6 = _config(tmp_path, namesrv=NS, client_listen=("::", 0), advertise_client=("[::1]", 0))
    assert v6.registered("client", ("::", 10911)) == ("[::1]", 10911)


@pytest.mark.parametrize("args, needle", [
    (["--listen", "0.0.0.0:0"], "--advertise HOST:PORT"),
    (["--admin-listen", "0.0.0.0:0"], "--admin-advertise"),
    (["--advertise", "::1"], "expected HOST or HOST:PORT"),
    (["--advertise", "[::1"], "expected HOST or HOST:PORT"),
    (["--advertise", "[::1:5"], "expected HOST or HOST:PORT"),
    (["--admin-advertise", "h:99999"], "expected HOST or HOST:PORT"),
    (["--advertise", "0.0.0.0"], "is every interface"),
    (["--admin-advertise", "[::]:8080"], "is every interface"),
])
def test_the_command_line_refuses_an_address_no_one_can_dial(
        tmp_path: Path, args: list[str], needle: str) -> None:
    base = ["start", "--group", "g", "--id", "n0", "--peers", "n0=127.0.0.1:1",
            "--data-dir", str(tmp_path), "--namesrv", NS[0]]
    result = CliRunner().invoke(main, [*base, *args])
    assert result.exit_code == 2 and needle in result.output, result.output


@pytest.mark.slow
def test_a_group_advertising_a_host_name_is_reached_at_that_name(tmp_path: Path) -> None:
    async def scenario(ns: str) -> None:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://{ns}/v1/cluster") as resp:
                (group,) = (await resp.json())["groups"]
            assert {n["client_address"].split(":")[0] for n in group["nodes"]} == {"localhost"}
            assert {n["admin_address"].split(":")[0] for n in group["nodes"]} == {"localhost"}

            async def snapshot() -> dict[str, Any]:
                async with s.get(f"http://{ns}/console/api/snapshot") as resp:
                    return dict(await resp.json())
            (seen,) = (await console_ok(snapshot))["groups"]  # each node read at localhost
            assert all(n["registration"]["admin_address"].startswith("localhost:")
                       for n in seen["nodes"]), seen["nodes"]
        async with Producer(ns) as p:
            sent = await p.send(Message("adv", b"through localhost"))
        async with PullConsumer(ns, "adv-reader") as c:
            got = await c.pull(sent.queue, sent.queue_offset, 1)
        assert [m.body for m in got.messages] == [b"through localhost"]

    with namesrv_group(tmp_path, "--advertise", "localhost",
                       "--admin-advertise", "localhost") as (ns, _):
        asyncio.run(scenario(ns))
