"""``dledger node list|stop|kill|restart``: the nodes of a cluster that ``dledger up`` runs,
found through ``DATA_DIR/up.json``.

``stop`` and ``kill`` send SIGTERM or SIGKILL to the recorded PID, and only once /proc shows it
is still that node; ``up`` is told first, so that its watch reports the exit as asked for, not
as a crash. ``restart`` stops a running node that way, then asks ``up`` to start it again with
its recorded command line: ``up`` owns the processes (it reaps them, and stops them on Ctrl-C),
so a node started by anyone else would outlive it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from cli import control

STOP_TIMEOUT_S = 20.0  # a clean stop closes the log and writes a checkpoint
KILL_TIMEOUT_S = 5.0
START_TIMEOUT_S = 60.0  # up waits up to 20 s for the ready line, on a machine that may be busy
POLL_S = 0.05
F = TypeVar("F", bound=Callable[..., Any])

data_dir_option = click.option(
    "--data-dir", default="./data", show_default=True, type=click.Path(file_okay=False),
    help="The data directory of the dledger up that runs the cluster.")


@click.group()
def node() -> None:
    """The nodes of a cluster that `dledger up` runs (see DATA_DIR/up.json)."""


@node.command("list")
@data_dir_option
def node_list(data_dir: str) -> None:
    """Each node's PID, state, addresses and log."""
    ctl = _control(data_dir)
    for rec in ctl["nodes"]:
        state = f"pid {rec['pid']}" if _running(rec) else f"not running{_ended(rec)}"
        click.echo(f"{rec['group']} {rec['node']}: {state}  client {rec['client']}  "
                   f"admin {ctl.get('scheme', 'http')}://{rec['admin']}/status  log {rec['log']}")


def _node_arguments(f: F) -> F:
    return data_dir_option(click.argument("group")(click.argument("node_id", metavar="NODE")(f)))


def _signalling(verb: str, sig: signal.Signals, timeout_s: float, done: str, doc: str) -> None:
    """``dledger node stop`` and ``kill``: the same steps with another signal."""
    @node.command(verb, help=doc)
    @_node_arguments
    def command(data_dir: str, group: str, node_id: str) -> None:
        _, rec = _target(data_dir, group, node_id)
        _signal(data_dir, rec, sig, verb, timeout_s)
        click.echo(f"{done} {group}-{node_id} (pid {rec['pid']})")


_signalling("stop", signal.SIGTERM, STOP_TIMEOUT_S, "stopped",
            "Stop node NODE of GROUP cleanly (SIGTERM) and wait until it has exited.")
_signalling("kill", signal.SIGKILL, KILL_TIMEOUT_S, "killed",
            "Kill node NODE of GROUP (SIGKILL: a crash, nothing flushed or closed).")


@node.command("restart")
@_node_arguments
def node_restart(data_dir: str, group: str, node_id: str) -> None:
    """Stop node NODE of GROUP if it runs (SIGTERM), then have up start it again."""
    ctl, rec = _target(data_dir, group, node_id)
    if _running(rec):
        _signal(data_dir, rec, signal.SIGTERM, "restart", STOP_TIMEOUT_S)
    token = _post(data_dir, {"action": "start", "group": group, "node": node_id})
    up = (ctl["up_pid"], ctl["up_argv"])
    reply = control.wait_reply(os.path.abspath(data_dir), token, START_TIMEOUT_S, up)
    if reply is None:
        gone = "exited" if not control.is_process(*up) else \
            f"did not answer within {START_TIMEOUT_S:.0f} s"
        raise click.ClickException(f"dledger up (pid {up[0]}) {gone}: {group}-{node_id} "
                                   f"was not started")
    if not reply.get("ok"):
        raise click.ClickException(f"{group}-{node_id} did not start: {reply.get('error')}")
    click.echo(f"started {group}-{node_id}: pid {reply['pid']}, admin "
               f"{ctl.get('scheme', 'http')}://{reply['admin']}/status")


def _control(data_dir: str) -> dict[str, Any]:
    data_dir = os.path.abspath(data_dir)
    try:
        ctl = control.load(data_dir)
        control.check_up(ctl, control.control_path(data_dir))
    except control.ControlError as err:
        raise click.ClickException(str(err)) from err
    return ctl


def _target(data_dir: str, group: str, node_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    ctl = _control(data_dir)
    try:
        return ctl, control.find_node(ctl, group, node_id)
    except control.ControlError as err:
        raise click.ClickException(str(err)) from err


def _running(rec: dict[str, Any]) -> bool:
    try:
        return control.node_is_running(rec)
    except control.ControlError as err:
        raise click.ClickException(str(err)) from err


def _ended(rec: dict[str, Any]) -> str:
    return f": it {rec['ended']}" if rec.get("ended") else ""


def _post(data_dir: str, request: dict[str, Any]) -> str:
    try:
        return control.post_request(os.path.abspath(data_dir), request)
    except OSError as err:  # up removed its request folder: it is stopping
        raise click.ClickException(f"cannot reach dledger up: {err}") from err


def _signal(data_dir: str, rec: dict[str, Any], sig: signal.Signals, verb: str,
            timeout_s: float) -> None:
    """Signal the recorded PID (checked first) and wait until that process has exited."""
    name = f"{rec['group']}-{rec['node']}"
    if not _running(rec):
        raise click.ClickException(f"{name} is not running{_ended(rec)}; "
                                   f"`dledger node restart {rec['group']} {rec['node']}` starts it")
    _post(data_dir, {"action": "expect-exit", "group": rec["group"], "node": rec["node"],
                     "pid": rec["pid"], "how": f"dledger node {verb}"})
    try:
        os.kill(rec["pid"], sig)
    except ProcessLookupError:
        return  # it exited between the check and the signal
    deadline = time.monotonic() + timeout_s
    while control.is_process(rec["pid"], rec["argv"]):  # a zombie counts as exited
        if time.monotonic() > deadline:
            raise click.ClickException(f"{name} (pid {rec['pid']}) still runs {timeout_s:.0f} s "
                                       f"after {sig.name}; `dledger node kill {rec['group']} "
                                       f"{rec['node']}` ends it")
        time.sleep(POLL_S)  # waiting for the process to exit, bounded by the deadline
