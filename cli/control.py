"""The control file of a cluster that ``dledger up`` runs, and the requests ``dledger node``
sends it.

``DATA_DIR/up.json`` names the ``up`` process (PID and command line) and, per node, its PID,
command line, addresses, log and state. Only ``up`` writes it (atomically: a temporary file
renamed over it) and it removes it on exit. A PID from the file is trusted only while
``/proc/PID/cmdline`` is still the recorded command line, so a signal never reaches a process
that merely reuses the number. Requests go as files into ``DATA_DIR/up-requests/`` (one JSON
object each, renamed into place); ``up`` reads them on its next turn and, where asked, answers
with ``TOKEN.reply.json``. Files, not a socket: a Unix socket's path is limited to about 100
bytes, a data directory's is not."""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any

CONTROL_NAME = "up.json"
REQUESTS_NAME = "up-requests"
VERSION = 1
REPLY_SUFFIX = ".reply.json"
POLL_S = 0.05  # how often a waiting command looks for up's answer


class ControlError(Exception):
    """The control file is missing, unreadable or stale, or names no such node."""


def control_path(data_dir: str) -> str:
    return os.path.join(data_dir, CONTROL_NAME)


def write_json_atomic(path: str, obj: Any) -> None:
    """Readers see the old file or the new one, never a part. Not fsynced: the file describes
    running processes and is worthless after a crash of the machine."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def process_argv(pid: int) -> list[str] | None:
    """The command line of live process ``pid``; None if there is none (or only a zombie, a
    dead child its parent has not reaped yet, or a process exiting: its command line is gone
    before it turns zombie). Linux's /proc is the only source."""
    if not os.path.isdir("/proc/self"):
        raise ControlError("dledger node needs /proc (Linux) to check the recorded PIDs")
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            state = f.read().rpartition(")")[2].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    except PermissionError:
        return []  # alive, someone else's: not a process of ours
    if state in ("Z", "X") or not raw:
        return None  # (an empty command line: a process on its way out, or a kernel thread)
    return [a.decode(errors="surrogateescape") for a in raw.split(b"\0")[:-1]]


def is_process(pid: int | None, argv: list[str]) -> bool:
    return pid is not None and process_argv(pid) == argv


def load(data_dir: str) -> dict[str, Any]:
    path = control_path(data_dir)
    try:
        with open(path, encoding="utf-8") as f:
            ctl = json.load(f)
    except FileNotFoundError as err:
        raise ControlError(f"no cluster started by dledger up in {data_dir} ({path} does not "
                           f"exist; give up's --data-dir)") from err
    except (OSError, ValueError) as err:
        raise ControlError(f"{path} cannot be read: {err}") from err
    if not isinstance(ctl, dict) or ctl.get("version") != VERSION:
        raise ControlError(f"{path} is not a version {VERSION} control file of dledger up")
    return ctl


def check_up(ctl: dict[str, Any], path: str) -> None:
    """Refuse a control file whose ``up`` is gone (killed: it could not remove the file)."""
    if is_process(ctl["up_pid"], ctl["up_argv"]):
        return
    orphans = [f"{n['group']}-{n['node']} pid {n['pid']}" for n in ctl["nodes"]
               if is_process(n["pid"], n["argv"])]
    left = f"; its nodes still running: {', '.join(orphans)}" if orphans else ""
    raise ControlError(f"{path} is stale: dledger up (pid {ctl['up_pid']}) is not running{left}")


def find_node(ctl: dict[str, Any], group: str, node: str) -> dict[str, Any]:
    records: list[dict[str, Any]] = ctl["nodes"]  # one record per node, as `dledger up` wrote it
    groups = sorted({n["group"] for n in records})
    if group not in groups:
        raise ControlError(f"no group {group!r} in this cluster (groups: {', '.join(groups)})")
    for n in records:
        if n["group"] == group and n["node"] == node:
            return n
    nodes = ", ".join(n["node"] for n in records if n["group"] == group)
    raise ControlError(f"group {group} has no node {node!r} (nodes: {nodes})")


def node_is_running(rec: dict[str, Any]) -> bool:
    """True if the recorded PID is that node; an error if the PID now runs something else."""
    if rec["pid"] is None:
        return False
    argv = process_argv(rec["pid"])
    if argv is None:
        return False
    if argv != rec["argv"]:
        raise ControlError(f"the control file is stale: pid {rec['pid']} is no longer "
                           f"{rec['group']}-{rec['node']} (it runs {' '.join(argv)[:80]!r})")
    return True


# -- requests to up -------------------------------------------------------------------------------


def requests_dir(data_dir: str) -> str:
    return os.path.join(data_dir, REQUESTS_NAME)


def post_request(data_dir: str, request: dict[str, Any]) -> str:
    token = uuid.uuid4().hex
    write_json_atomic(os.path.join(requests_dir(data_dir), f"{token}.json"), request)
    return token


def wait_reply(data_dir: str, token: str, timeout_s: float,
               up: tuple[int, list[str]]) -> dict[str, Any] | None:
    """The answer of ``up`` (PID, command line) to request ``token``; None if none came within
    ``timeout_s`` or ``up`` exited meanwhile."""
    path = os.path.join(requests_dir(data_dir), token + REPLY_SUFFIX)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and is_process(*up):
        try:
            with open(path, encoding="utf-8") as f:
                reply: dict[str, Any] = json.load(f)
        except FileNotFoundError:
            time.sleep(POLL_S)  # up answers on its next turn (every 0.2 s)
            continue
        os.unlink(path)
        return reply
    try:  # unanswered: withdraw it, so that a late up does not act on it
        os.unlink(os.path.join(requests_dir(data_dir), f"{token}.json"))
    except FileNotFoundError:
        pass  # up took it after all: its late reply is left unread
    return None


def take_requests(data_dir: str) -> list[tuple[str, dict[str, Any]]]:
    """The pending requests (oldest first), removed from the directory (up's side)."""
    folder = requests_dir(data_dir)
    try:
        names = [n for n in os.listdir(folder)  # not replies, nor requests still being written
                 if n.endswith(".json") and not n.endswith(REPLY_SUFFIX)]
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as f:
                request = json.load(f)
            found.append((os.stat(path).st_mtime_ns, name[:-len(".json")], request))
            os.unlink(path)
        except (OSError, ValueError):
            continue  # withdrawn meanwhile, or not ours
    return [(token, req) for _, token, req in sorted(found) if isinstance(req, dict)]


def post_reply(data_dir: str, token: str, reply: dict[str, Any]) -> None:
    write_json_atomic(os.path.join(requests_dir(data_dir), token + REPLY_SUFFIX), reply)
