"""``dledger up``: a NameServer and broker groups in the foreground, until Ctrl-C or SIGTERM.

Owns starting and stopping the processes (through ``LocalCluster``), printing their PIDs and
addresses, and the watch that follows: each turn the ``Supervisor`` answers ``dledger node``'s
requests, reports a node that exits (plainly as stopped when ``dledger node`` stopped it, with
how it ended and its last log line when it crashed) and keeps ``DATA_DIR/up.json`` true."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import aiohttp
import click

from cli import control
from cli.common import http_session
from cli.namesrv_proc import NameSrvProcess
from cli.tls import UpTls
from dledger import log_cli
from dledger.localcluster import ClusterError, LocalCluster, ServerProcess, describe_exit
from dledger.logfmt import LOG_FORMATS, LOG_LEVEL_DEFAULT, LOG_LEVELS
from protocol.cluster_key import KEY_FILE_NAME, ClusterKeyError, generate_key_file
from protocol.tls import ENV_CA

GROUP_NAMES = "abcdefghi"
REGISTER_INTERVAL_S = 5  # a NameServer restarted under up learns the groups again this soon
TURN_S = 0.2  # the watch's period: how soon an exit or a request is noticed
LEADERS_TIMEOUT_S = 30.0


@click.command()
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
@click.option("--grpc-port", type=int, default=8081, show_default=True,
              help="gRPC port for RocketMQ 5 clients of group a's n0 (same scheme); 0 picks "
                   "free ports.")
@click.option("--remoting-port", type=int, default=30911, show_default=True,
              help="Remoting port for RocketMQ 4.x clients of group a's n0 (same scheme); 0 "
                   "picks free ports. 4.x clients need only the NameServer's address.")
@click.option("--tls", "use_tls", is_flag=True,
              help="TLS on every listener, mutual TLS on peer links: a test CA and certificates "
                   "are made under DATA_DIR/tls (docs/tls.md).")
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False),
              default=LOG_LEVEL_DEFAULT, show_default=True,
              help="Of the NameServer and the brokers, in DATA_DIR/*.log (INFO: start and stop, "
                   "elections, leader changes, registrations ...: docs/operations.md).")
@click.option("--log-format", type=click.Choice(LOG_FORMATS), default="text", show_default=True,
              help="Their log lines as text or as JSON objects.")
@click.option("--exit-after-s", type=float, default=None, help="Stop by itself after this long.")
def up(groups: int, replicas: int, data_dir: str, flush_mode: str, namesrv_port: int,
       peer_port: int, client_port: int, grpc_port: int, remoting_port: int, use_tls: bool,
       log_level: str, log_format: str, exit_after_s: float | None) -> None:
    """Start a NameServer and broker groups in the foreground; Ctrl-C stops everything.

    It prints each node's PID and addresses and keeps them in DATA_DIR/up.json, through which
    `dledger node stop|kill|restart GROUP NODE` acts on this cluster's nodes only."""
    data_dir = os.path.abspath(data_dir)
    os.makedirs(data_dir, exist_ok=True)
    _claim(data_dir)
    stop = {"now": False}
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    up_tls = UpTls.prepare(data_dir) if use_tls else None
    if up_tls is not None:
        os.environ[ENV_CA] = up_tls.ca_file  # this process's own calls (the leader wait)
    key_file = os.path.join(data_dir, KEY_FILE_NAME)  # signs registrations (docs/security.md)
    try:
        generate_key_file(key_file)
    except ClusterKeyError as err:
        raise click.ClickException(str(err)) from err
    logs = ("--log-level", log_level, "--log-format", log_format, "--log-stream", "stderr")
    namesrv = NameSrvProcess.start(namesrv_port, data_dir,
                                   ("--cluster-key-file", key_file, *logs,
                                    *(up_tls.args("namesrv") if up_tls else ())))
    clusters: list[LocalCluster] = []
    try:
        for g in range(groups):
            clusters.append(_start_group(data_dir, GROUP_NAMES[g], replicas, flush_mode,
                                         peer_port + 10 * g if peer_port else 0,
                                         client_port + 10 * g if client_port else 0,
                                         grpc_port + 10 * g if grpc_port else 0,
                                         remoting_port + 10 * g if remoting_port else 0,
                                         namesrv.address, up_tls, logs))
        supervisor = Supervisor(data_dir, namesrv, clusters, "https" if up_tls else "http")
        supervisor.write()
        asyncio.run(_wait_leaders(namesrv.address, [c.group for c in clusters], LEADERS_TIMEOUT_S))
        _print_up(namesrv, clusters, flush_mode, data_dir, up_tls, log_level.upper())
        deadline = time.monotonic() + exit_after_s if exit_after_s else None
        while not stop["now"] and (deadline is None or time.monotonic() < deadline):
            supervisor.turn()
            time.sleep(TURN_S)  # the foreground wait of an interactive command
        click.echo("stopping...")
    finally:
        for c in clusters:
            c.stop()
        namesrv.stop()
        _release(data_dir)


def _claim(data_dir: str) -> None:
    """Refuse a data directory that a running up uses; clear what a killed one left."""
    try:
        ctl = control.load(data_dir)
        control.check_up(ctl, control.control_path(data_dir))
    except control.ControlError:
        _release(data_dir)  # none, unreadable or stale: ours now
        os.makedirs(control.requests_dir(data_dir), exist_ok=True)
        return
    raise click.ClickException(f"{data_dir} is in use by dledger up (pid {ctl['up_pid']}): "
                               f"stop it first, or give another --data-dir")


def _release(data_dir: str) -> None:
    folder = control.requests_dir(data_dir)
    for path in [control.control_path(data_dir),
                 *(os.path.join(folder, n) for n in _listdir(folder))]:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass  # already gone
    try:
        os.rmdir(folder)
    except OSError:
        pass  # gone, or a request file arrived meanwhile: harmless, the next up clears it


def _listdir(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []


def _start_group(data_dir: str, group: str, replicas: int, flush_mode: str, peer_port: int,
                 client_port: int, grpc_port: int, remoting_port: int, namesrv: str,
                 up_tls: UpTls | None = None, logs: tuple[str, ...] = ()) -> LocalCluster:
    cluster = LocalCluster(
        data_dir, size=replicas, group=group, flush_mode=flush_mode, peer_port=peer_port,
        client_port=client_port,
        program=("-m", "broker", "start", "--namesrv", namesrv,
                 "--register-interval-s", str(REGISTER_INTERVAL_S),
                 "--cluster-key-file", os.path.join(data_dir, KEY_FILE_NAME), *logs),
        node_args={f"n{i}": ("--grpc-listen", f"127.0.0.1:{grpc_port + i if grpc_port else 0}",
                             "--remoting-listen",
                             f"127.0.0.1:{remoting_port + i if remoting_port else 0}",
                             *(up_tls.args(f"{group}-n{i}", peer_mtls=True) if up_tls else ()))
                   for i in range(replicas)})
    try:
        cluster.start()
    except ClusterError as err:
        cluster.stop()
        raise click.ClickException(log_cli._start_failure(str(err))) from err
    return cluster


def grpc_of(s: ServerProcess) -> str | None:
    grpc = s.ready.get("grpc")
    return f"{grpc[0]}:{grpc[1]}" if grpc else None


def remoting_of(s: ServerProcess) -> str | None:
    remoting = s.ready.get("remoting")
    return f"{remoting[0]}:{remoting[1]}" if remoting else None


def admin_of(s: ServerProcess) -> str | None:
    admin = s.ready.get("admin")
    return f"{admin[0]}:{admin[1]}" if admin else None


def _print_up(namesrv: NameSrvProcess, clusters: list[LocalCluster], flush_mode: str,
              data_dir: str, up_tls: UpTls | None = None, log_level: str = LOG_LEVEL_DEFAULT
              ) -> None:
    ns = namesrv.address
    scheme = "https" if up_tls else "http"
    click.echo(f"NameServer {ns} (pid {namesrv.proc.pid}); {len(clusters)} broker group(s), "
               f"flush mode {flush_mode}, data in {data_dir}")
    for c in clusters:
        for nid, s in c.servers.items():
            click.echo(f"  group {c.group} {nid}: pid {s.pid}  client {_fmt(s.client_address)}  "
                       f"peer {_fmt(s.peer_address)}  grpc {grpc_of(s)}  "
                       f"remoting {remoting_of(s)}  "
                       f"admin {scheme}://{admin_of(s)}/status")
    click.echo(f"\nconsole:  {scheme}://{ns}/console")
    if up_tls is not None:
        click.echo(f"TLS on every listener (mutual TLS between peers); CA {up_tls.ca_file}")
        click.echo(f"clients:  export DLEDGER_TLS_CA={up_tls.ca_file}   (or --tls-ca FILE, "
                   f"or Producer(..., tls_ca=FILE))")
    click.echo(f"connect:  dledger status --namesrv {ns}")
    click.echo(f"          dledger send --namesrv {ns} orders 'hello'")
    click.echo(f"          dledger consume --namesrv {ns} orders")
    grpc = ";".join(a for c in clusters for s in c.servers.values() if (a := grpc_of(s)))
    click.echo(f"RocketMQ 5 clients (gRPC): endpoints \"{grpc}\"")
    click.echo(f"RocketMQ 4.x clients (remoting): NameServer address \"{ns}\"")
    click.echo(f"registrations are signed with {os.path.join(data_dir, KEY_FILE_NAME)}: a node "
               f"started by hand there takes --cluster-key-file (docs/security.md)")
    click.echo(f"nodes:    dledger node stop|kill|restart GROUP NODE --data-dir {data_dir}  "
               f"(PIDs in {control.control_path(data_dir)})")
    click.echo(f"logs:     {os.path.join(data_dir, '*.log')} (level {log_level}: elections, "
               f"leader changes, registrations ...)")
    click.echo("Ctrl-C stops everything.")


def _fmt(addr: tuple[str, int]) -> str:
    return f"{addr[0]}:{addr[1]}"


async def _wait_leaders(ns: str, groups: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    session, scheme = http_session(2.0)  # https under --tls (DLEDGER_TLS_CA is set)
    async with session:
        while time.monotonic() < deadline:
            try:
                async with session.get(f"{scheme}://{ns}/v1/cluster") as resp:
                    led = {g["group"] for g in (await resp.json())["groups"] if g["leader"]}
                if set(groups) <= led:
                    return
            except (aiohttp.ClientError, TimeoutError):
                pass  # not up yet: the loop retries until the deadline
            await asyncio.sleep(0.1)
    raise click.ClickException(f"no leader registered for every group within {timeout_s} s")


class Supervisor:
    """The watch of a running ``up``: requests of ``dledger node``, exits, ``up.json``."""

    def __init__(self, data_dir: str, namesrv: NameSrvProcess, clusters: list[LocalCluster],
                 scheme: str = "http"):
        self.data_dir = data_dir
        self.scheme = scheme  # of the admin listeners (https under --tls)
        self.namesrv = namesrv
        self.nodes = {(c.group, nid): (c, s) for c in clusters for nid, s in c.servers.items()}
        self.expected: dict[tuple[str, str], tuple[int, str]] = {}  # from dledger node: pid, how
        self.ended: dict[tuple[str, str], str] = {}  # nodes not running: how they ended
        self.argv = control.process_argv(os.getpid()) if os.path.isdir("/proc/self") else []

    def turn(self) -> None:
        starts = self._take_requests()
        if self.namesrv.proc.poll() is not None:
            raise click.ClickException(f"the NameServer {describe_exit(self.namesrv.proc.returncode)}"
                                       f"; stopping{self.namesrv.last_words()}")
        for key, (cluster, s) in self.nodes.items():
            if key not in self.ended and not s.running:
                starts += self._take_requests()  # a stop's notice is written before its signal
                self._report_exit(key, cluster, s)
        for token, group, node in starts:
            control.post_reply(self.data_dir, token, self._start(group, node))

    def _take_requests(self) -> list[tuple[str, str, str]]:
        starts = []
        for token, req in control.take_requests(self.data_dir):
            key = (str(req.get("group")), str(req.get("node")))
            if key not in self.nodes:
                control.post_reply(self.data_dir, token, {"ok": False, "error": f"no node {key}"})
            elif req.get("action") == "expect-exit":  # dledger node stop|kill is about to signal
                self.expected[key] = (int(req["pid"]), str(req["how"]))
            elif req.get("action") == "start":
                starts.append((token, *key))
            else:
                control.post_reply(self.data_dir, token,
                                   {"ok": False, "error": f"unknown action {req.get('action')!r}"})
        return starts

    def _report_exit(self, key: tuple[str, str], cluster: LocalCluster, s: ServerProcess) -> None:
        assert s.proc is not None
        name = f"{key[0]}-{key[1]}"
        pid, how = self.expected.pop(key, (None, ""))
        if pid == s.proc.pid:  # as asked: said plainly, not as a crash
            self.ended[key] = f"{describe_exit(s.proc.returncode)} on `{how}`"
            again = "" if "restart" in how else \
                f"; `dledger node restart {key[0]} {key[1]}` starts it again"
            click.echo(f"broker {name} {self.ended[key]}{again}")
        else:
            self.ended[key] = describe_exit(s.proc.returncode)
            lines = cluster.log_of_last_start(s.node_id).strip().splitlines()
            said = (f"last line of {s.log_path}: {lines[-1]}" if lines
                    else f"it wrote nothing to {s.log_path}")
            click.echo(f"broker {name} {self.ended[key]}; its group carries on without it "
                       f"({said})", err=True)
        self.write()

    def _start(self, group: str, node: str) -> dict[str, Any]:
        cluster, s = self.nodes[(group, node)]
        if s.running:
            return {"ok": False, "error": f"{group}-{node} is running (pid {s.pid})"}
        try:
            cluster.restart(node)
        except ClusterError as err:
            self.ended[(group, node)] = "did not start again"
            self.write()
            return {"ok": False, "error": log_cli._start_failure(str(err))}
        self.ended.pop((group, node), None)
        self.write()
        click.echo(f"broker {group}-{node} started again: pid {s.pid}, admin "
                   f"{self.scheme}://{admin_of(s)}/status")
        return {"ok": True, "pid": s.pid, "admin": admin_of(s)}

    def write(self) -> None:
        nodes = [{"group": g, "node": nid, "pid": s.pid if s.running else None,
                  "argv": cluster.command(nid), "client": _fmt(s.client_address),
                  "peer": _fmt(s.peer_address), "admin": admin_of(s), "log": s.log_path,
                  "data_dir": s.data_dir, "state": "running" if s.running else "stopped",
                  "ended": self.ended.get((g, nid))}
                 for (g, nid), (cluster, s) in self.nodes.items()]
        control.write_json_atomic(control.control_path(self.data_dir), {
            "version": control.VERSION, "up_pid": os.getpid(), "up_argv": self.argv,
            "namesrv": self.namesrv.address, "namesrv_pid": self.namesrv.proc.pid,
            "scheme": self.scheme, "nodes": nodes})
