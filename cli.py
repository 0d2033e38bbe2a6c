"""Every command line entry point (click): ``dledger up`` (a NameServer and broker groups in the
foreground), ``dledger status``, ``dledger topic ...``, ``dledger send``, ``dledger consume``,
``dledger consumer progress``, and ``dledger log ...`` for a bare replicated-log group. The
servers' own commands are ``dledger-broker`` and ``dledger-namesrv``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import aiohttp
import click

from broker import bench as broker_bench
from broker import protocol as bp
from client import ClientError, Message, Producer, PullConsumer
from client.routes import GroupRoute, Routes, client_error
from dledger import log_cli
from dledger.errors import DLedgerError
from dledger.localcluster import ClusterError, LocalCluster

NAMESRV_HELP = "NameServer address(es): host:port[,host:port]"


@click.group()
def main() -> None:
    """dledger: a message broker cluster on Raft-replicated commitlogs."""


main.add_command(log_cli.main, name="log")


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
              add_help_option=False)
@click.pass_context
def chaos(ctx: click.Context) -> None:
    """Live chaos scenarios on real processes: dledger chaos run --help (needs the dev extra)."""
    try:  # loaded on use: the harness needs the dev extra (toxiproxy-python, matplotlib)
        from chaos.live.command import chaos as chaos_group
    except ImportError as err:
        raise click.ClickException(f"dledger chaos needs the dev extra "
                                   f"(pip install -e '.[dev]'): {err}") from err
    chaos_group.main(args=ctx.args, prog_name="dledger chaos")


# -- dledger up ------------------------------------------------------------------------------------


@main.command()
@click.option("--groups", type=click.IntRange(1, 9), default=1, show_default=True,
              help="Broker groups (a, b, c ...).")
@click.option("--replicas", type=click.IntRange(1, 9), default=3, show_default=True,
              help="Nodes per group.")
@click.option("--data-dir", default="./data", show_default=True, type=click.Path(file_okay=False))
@click.option("--flush-mode", type=click.Choice(["sync", "async"]), default="sync", show_default=True)
@click.option("--namesrv-port", type=int, default=9876, show_default=True, help="0 picks a free port.")
@click.option("--peer-port", type=int, default=20911, show_default=True,
              help="Peer port of group a's n0 (then +1 per node, +10 per group); 0 picks free ports.")
@click.option("--client-port", type=int, default=10911, show_default=True,
              help="Client port of group a's n0 (same scheme); 0 picks free ports.")
@click.option("--exit-after-s", type=float, default=None, help="Stop by itself after this long.")
def up(groups: int, replicas: int, data_dir: str, flush_mode: str, namesrv_port: int,
       peer_port: int, client_port: int, exit_after_s: float | None) -> None:
    """Start a NameServer and broker groups in the foreground; Ctrl-C stops everything."""
    data_dir = os.path.abspath(data_dir)
    os.makedirs(data_dir, exist_ok=True)
    stop = {"now": False}
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    ns_proc, ns = _start_namesrv(namesrv_port, data_dir)
    clusters: list[LocalCluster] = []
    try:
        for g in range(groups):
            cluster = LocalCluster(
                data_dir, size=replicas, group="abcdefghi"[g], flush_mode=flush_mode,
                peer_port=peer_port + 10 * g if peer_port else 0,
                client_port=client_port + 10 * g if client_port else 0,
                program=("-m", "broker", "start", "--namesrv", ns, "--register-interval-s", "5"))
            clusters.append(cluster)
            try:
                cluster.start()
            except ClusterError as err:
                raise click.ClickException(log_cli._start_failure(str(err))) from err
        _print_up(ns, clusters, flush_mode, data_dir)
        deadline = time.monotonic() + exit_after_s if exit_after_s else None
        reported: set[str] = set()
        while not stop["now"] and (deadline is None or time.monotonic() < deadline):
            if ns_proc.poll() is not None:
                raise click.ClickException("the NameServer exited; stopping")
            for c in clusters:  # a broker dying is a fault to watch, not a reason to stop
                for nid, srv in c.servers.items():
                    name = f"{c.group}-{nid}"
                    if not srv.running and name not in reported:
                        reported.add(name)
                        click.echo(f"broker {name} exited; its group carries on without it "
                                   f"(see {srv.log_path})", err=True)
            time.sleep(0.2)  # the foreground wait of an interactive command
        click.echo("stopping...")
    finally:
        for c in clusters:
            c.stop()
        ns_proc.terminate()
        ns_proc.wait(timeout=10)


def _start_namesrv(port: int, data_dir: str) -> tuple[subprocess.Popen[str], str]:
    with open(os.path.join(data_dir, "namesrv.log"), "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "namesrv", "--listen", f"127.0.0.1:{port}"],
                                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                text=True, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=10)
        raise click.ClickException(f"the NameServer did not start (see {data_dir}/namesrv.log)")
    host, p = json.loads(line)["listen"]
    return proc, f"{host}:{p}"


def _print_up(ns: str, clusters: list[LocalCluster], flush_mode: str, data_dir: str) -> None:
    asyncio.run(_wait_leaders(ns, [c.group for c in clusters], 30))
    click.echo(f"NameServer {ns}; {len(clusters)} broker group(s), flush mode {flush_mode}, "
               f"data in {data_dir}")
    for c in clusters:
        for nid, s in c.servers.items():
            click.echo(f"  group {c.group} {nid}: client {s.client_address[0]}:{s.client_address[1]}"
                       f"  peer {s.peer_address[0]}:{s.peer_address[1]}")
    click.echo(f"\nconnect:  dledger status --namesrv {ns}")
    click.echo(f"          dledger send --namesrv {ns} orders 'hello'")
    click.echo(f"          dledger consume --namesrv {ns} orders")
    click.echo("Ctrl-C stops everything.")


async def _wait_leaders(ns: str, groups: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(f"http://{ns}/v1/cluster") as resp:
                    led = {g["group"] for g in (await resp.json())["groups"] if g["leader"]}
                if set(groups) <= led:
                    return
            except (aiohttp.ClientError, TimeoutError):
                pass  # not up yet: the loop retries until the deadline
            await asyncio.sleep(0.1)
    raise click.ClickException(f"no leader registered for every group within {timeout_s} s")


# -- dledger status --------------------------------------------------------------------------------


@main.command()
@click.option("--namesrv", default="127.0.0.1:9876", show_default=True, help=NAMESRV_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--watch", type=float, default=None, help="Repeat every N seconds until interrupted.")
def status(namesrv: str, as_json: bool, watch: float | None) -> None:
    """Per group and node: role, term, indexes, follower lag and last contact, health. Exit code 2
    when a group has no leader or has lost its quorum."""
    while True:
        rows = asyncio.run(_cluster_status(namesrv))
        click.echo(json.dumps(rows, indent=2) if as_json else _status_table(rows))
        if watch is None:
            break
        time.sleep(watch)
    if any(r["health"] != "ok" for r in rows):
        sys.exit(2)


async def _cluster_status(namesrv: str) -> list[dict[str, Any]]:
    ns = namesrv.split(",")[0].strip()
    rows: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        try:
            async with session.get(f"http://{ns}/v1/cluster") as resp:
                cluster = await resp.json()
        except (aiohttp.ClientError, TimeoutError) as err:
            raise click.ClickException(f"NameServer {ns} unreachable: {err}") from err
        for g in cluster["groups"]:
            nodes = [await _node_status(session, g["group"], n) for n in g["nodes"]]
            live = [n for n in nodes if n["role"] != "unreachable"]
            quorum = len(live) * 2 > len(g["nodes"])
            health = "ok" if g["leader"] and quorum else ("no leader" if quorum else "no quorum")
            rows.append({"group": g["group"], "leader": g["leader"], "term": g["term"],
                         "health": health, "nodes": nodes})
    return rows


async def _node_status(session: aiohttp.ClientSession, group: str, n: dict[str, Any]) -> dict[str, Any]:
    try:
        async with session.get(f"http://{n['admin_address']}/status") as resp:
            st = await resp.json()
    except (aiohttp.ClientError, TimeoutError) as err:
        return {"node": n["node_id"], "role": "unreachable", "error": str(err)}
    raft = st["raft"]
    return {"node": n["node_id"], "role": raft["role"], "term": raft["term"],
            "last_index": raft["last_index"], "commit_index": raft["commit_index"],
            "applied_index": st["applied_index"],
            "followers": {f["node_id"]: {"lag": raft["last_index"] - f["match_index"],
                                         "last_contact_ticks": f["last_contact_ticks"]}
                          for f in raft["followers"]}}


def _status_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'group':<6} {'node':<5} {'role':<12} {'term':>5} {'last':>8} {'commit':>8} "
             f"{'applied':>8}  followers (lag / last contact ticks)"]
    for g in rows:
        for n in g["nodes"]:
            if n["role"] == "unreachable":
                lines.append(f"{g['group']:<6} {n['node']:<5} unreachable")
                continue
            fol = ", ".join(f"{k}: {v['lag']} / {v['last_contact_ticks']}" for k, v in n["followers"].items())
            lines.append(f"{g['group']:<6} {n['node']:<5} {n['role']:<12} {n['term']:>5} "
                         f"{n['last_index']:>8} {n['commit_index']:>8} {n['applied_index']:>8}  {fol}")
        lines.append(f"{g['group']:<6} health: {g['health']}")
    return "\n".join(lines)


# -- topics, send, consume ------------------------------------------------------------------------------


@main.group()
def topic() -> None:
    """Create, update, delete, list and route topics."""


@topic.command("update")
@click.option("--namesrv", default="127.0.0.1:9876", show_default=True, help=NAMESRV_HELP)
@click.option("--read-queues", type=click.IntRange(0, 1024), required=True)
@click.option("--write-queues", type=click.IntRange(0, 1024), required=True)
@click.option("--perm", type=click.Choice(["2", "4", "6"]), default="6", show_default=True)
@click.option("--group", "groups", multiple=True, help="Only these broker groups (default: all).")
@click.argument("name")
def topic_update(namesrv: str, read_queues: int, write_queues: int, perm: str,
                 groups: tuple[str, ...], name: str) -> None:
    """Change topic NAME's read/write queue counts and permission."""
    async def run(routes: Routes) -> None:
        for g in await _groups(routes, groups):
            _, st = await routes.group_client(g).call_leader(
                bp.TOPIC_PUT, name, read_queues, write_queues, int(perm))
            click.echo(f"group {g.group}: {st}")
    _with_routes(namesrv, run)


@topic.command("status")
@click.option("--namesrv", default="127.0.0.1:9876", show_default=True, help=NAMESRV_HELP)
@click.argument("name")
def topic_status(namesrv: str, name: str) -> None:
    """Per group and queue: min and max offset of topic NAME."""
    async def run() -> None:
        async with PullConsumer(namesrv.split(","), "dledger-cli") as c:
            click.echo(f"{'queue':<12} {'min':>8} {'max':>8}")
            for mq in await c.fetch_queues(name):
                r = await c.pull(mq, 0, 0)
                click.echo(f"{mq.group + '/' + str(mq.queue_id):<12} {r.min_offset:>8} {r.max_offset:>8}")
    _run(run())


@topic.command("create")
@click.option("--namesrv", default="127.0.0.1:9876", show_default=True, help=NAMESRV_HELP)
@click.option("--queues", type=click.IntRange(1, 1024), default=4, show_default=True,
              help="Read and write queues per group.")
@click.option("--perm", type=click.Choice(["2", "4", "6"]), default="6", show_default=True)
@click.option("--group", "groups", multiple=True, help="Only these broker groups (default: all).")
@click.argument("name")
def topic_create(namesrv: str, queues: int, perm: str, groups: tuple[str, ...], name: str) -> None:
    """Create or update topic NAME on every broker group (cluster mode) or the given ones."""
    async def run(routes: Routes) -> None:
        for g in await _groups(routes, groups):
            _, st = await routes.group_client(g).call_leader(bp.TOPIC_PUT, name, queues, queues, int(perm))
            click.echo(f"group {g.group}: {st}")
    _with_routes(namesrv, run)


@topic.command("delete")
@click.option("--namesrv", default="127.0.0.1:9876", show_default=True, help=NAMESRV_HELP)
@click.argument("name")
def topic_delete(namesrv: str, name: str) -> None:
    """Delete topic NAME on every broker group."""
    async def run(routes: Routes) -> None:
        for g in await _groups(routes, ()):
            _, st = await routes.group_client(g).call_leader(bp.TOPIC_DELETE, name)
            click.echo(f"group {g.group}: {st}")
    _with_routes(namesrv, run)


@topic.command("list")
@click.option("--namesrv", default="127.0.0.1:9876", show_default=True, help=NAMESRV_HELP)
def topic_list(namesrv: str) -> None:
    """Topics known to the NameServer."""
    for t in asyncio.run(_get_json(namesrv, "/v1/topics"))["topics"]:
        click.echo(t)


@topic.command("route")
@click.option("--namesrv", default="127.0.0.1:9876", show_default=True, help=NAMESRV_HELP)
@click.argument("name")
def topic_route(namesrv: str, name: str) -> None:
    """Which groups serve topic NAME, with their nodes, leader and queues (JSON)."""
    click.echo(json.dumps(asyncio.run(_get_json(namesrv, f"/v1/topics/{name}/route")), indent=2))


@main.command()
@click.option("--namesrv", default="127.0.0.1:9876", show_default=True, help=NAMESRV_HELP)
@click.option("--tags", default="", help="The messages' tag.")
@click.option("--key", "keys", multiple=True, help="A message key (repeatable).")
@click.argument("topic_name")
@click.argument("bodies", nargs=-1, required=True)
def send(namesrv: str, tags: str, keys: tuple[str, ...], topic_name: str, bodies: tuple[str, ...]) -> None:
    """Send each BODY as one message to TOPIC_NAME; prints where it was stored (after commit)."""
    async def run() -> None:
        async with Producer(namesrv.split(",")) as producer:
            for body in bodies:
                r = await producer.send(Message(topic_name, body.encode(), tags=tags, keys=keys))
                click.echo(f"{r.status} {r.queue.group}/{r.queue.queue_id} offset {r.queue_offset} "
                           f"msg_id {r.msg_id} offset_msg_id {r.offset_msg_id}")
    _run(run())


@main.command()
@click.option("--namesrv", default="127.0.0.1:9876", show_default=True, help=NAMESRV_HELP)
@click.option("--group", "consumer_group", default=None,
              help="Start from this consumer group's committed offsets and commit what is read.")
@click.option("--from-offset", type=int, default=0, show_default=True)
@click.option("--from-timestamp-ms", type=int, default=None,
              help="Start each queue at its first message stored at or after this time "
                   "(milliseconds since the epoch).")
@click.option("--max", "max_messages", type=int, default=100, show_default=True)
@click.option("--count", "count_only", is_flag=True, help="Print only how many messages were read.")
@click.argument("topic_name")
def consume(namesrv: str, consumer_group: str | None, from_offset: int,
            from_timestamp_ms: int | None, max_messages: int, count_only: bool,
            topic_name: str) -> None:
    """Read messages of TOPIC_NAME from every queue (from an offset, or a group's progress)."""
    async def run() -> None:
        async with PullConsumer(namesrv.split(","), consumer_group or "dledger-cli") as consumer:
            total = 0
            for mq in await consumer.fetch_queues(topic_name):
                if consumer_group:
                    offset = max(0, await consumer.committed(mq))
                elif from_timestamp_ms is not None:
                    offset = await consumer.offset_for_timestamp(mq, from_timestamp_ms)
                else:
                    offset = from_offset
                res = await consumer.pull(mq, offset, max_messages)
                for m in res.messages:
                    total += 1
                    if not count_only:
                        click.echo(f"{mq.group}/{mq.queue_id}@{m.queue_offset} tags={m.tags!r} {m.body!r}")
                if consumer_group and res.messages:
                    await consumer.commit(mq, res.next_offset)
            if count_only:
                click.echo(total)
    _run(run())


@main.group()
def leader() -> None:
    """Leadership of broker groups."""


@leader.command("transfer")
@click.option("--namesrv", default="127.0.0.1:9876", show_default=True, help=NAMESRV_HELP)
@click.argument("group")
@click.argument("to")
def leader_transfer(namesrv: str, group: str, to: str) -> None:
    """Hand GROUP's leadership to node TO (it is caught up first)."""
    async def run(routes: Routes) -> None:
        for g in await _groups(routes, (group,)):
            node, _ = await routes.group_client(g).call_leader(bp.TRANSFER_LEADERSHIP, to,
                                                               timeout_s=10.0)
            click.echo(f"group {g.group}: leadership moved from {node} to {to}")
    _with_routes(namesrv, run)


@main.group()
def consumer() -> None:
    """Consumer group commands."""


@consumer.command("progress")
@click.option("--namesrv", default="127.0.0.1:9876", show_default=True, help=NAMESRV_HELP)
@click.argument("group")
@click.argument("topic_name")
def consumer_progress(namesrv: str, group: str, topic_name: str) -> None:
    """Per queue: the broker's max offset, GROUP's committed offset, and the difference."""
    async def run() -> None:
        async with PullConsumer(namesrv.split(","), group) as c:
            click.echo(f"{'queue':<12} {'max':>8} {'committed':>10} {'lag':>8}")
            for mq in await c.fetch_queues(topic_name):
                hi = (await c.pull(mq, 0, 0)).max_offset
                done = await c.committed(mq)
                click.echo(f"{mq.group + '/' + str(mq.queue_id):<12} {hi:>8} {done:>10} "
                           f"{hi - max(done, 0):>8}")
    _run(run())


# -- the broker benchmark ---------------------------------------------------------------------------


@main.command()
@broker_bench.options
def bench(**opts: Any) -> None:
    """Benchmark a 3-node broker group (both flush modes) against NATS JetStream R3, side by side:
    sync, 64 concurrent, 64 concurrent over 64 topics, batch, consume, failover. The replicated log
    alone: python -m dledger.bench."""
    sys.exit(broker_bench.main(**opts))


# -- plumbing -----------------------------------------------------------------------------------------


async def _groups(routes: Routes, only: tuple[str, ...]) -> list[GroupRoute]:
    groups = [g for g in await routes.cluster_groups() if not only or g.group in only]
    if not groups:
        raise click.ClickException("no broker group is registered at the NameServer")
    return groups


def _with_routes(namesrv: str, fn: Any) -> None:
    async def run() -> None:
        routes = Routes(namesrv.split(","))
        await routes.start()
        try:
            await fn(routes)
        finally:
            await routes.close()
    _run(run())


async def _get_json(namesrv: str, path: str) -> Any:
    ns = namesrv.split(",")[0].strip()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session:
        try:
            async with session.get(f"http://{ns}{path}") as resp:
                return await resp.json()
        except (aiohttp.ClientError, TimeoutError) as err:
            raise click.ClickException(f"NameServer {ns} unreachable: {err}") from err


def _run(coro: Any) -> None:
    try:
        asyncio.run(coro)
    except DLedgerError as err:
        mapped = client_error(err)
        raise click.ClickException(f"{type(mapped).__name__}: {err}") from err
    except ClientError as err:
        raise click.ClickException(f"{type(err).__name__}: {err}") from err


if __name__ == "__main__":
    main()
