"""Reading deploy/ for the offline checks of tests/ops/test_deploy.py: the Dockerfile's instructions,
the compose file with its variables interpolated as Compose does, the Kubernetes manifests, a
StatefulSet pod's command rendered as the kubelet would (its ordinal, its name and namespace
from the downward API, ``$(VAR)`` expanded) and run through the image's entrypoint script with
``dledger-broker`` replaced by a recorder, and a broker command line parsed by the broker's own
option parser (``dledger-broker start``'s click command and ``node_config``) without starting
anything. No container runtime or cluster is needed."""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from broker.cli import _advertised
from broker.cli import start as broker_start
from broker.config import BrokerConfig
from dledger.node.config import NodeConfig
from dledger.node_cli import node_config, parse_address
from namesrv.cli import cli as namesrv_cli
from protocol.namesrv_addrs import parse_namesrv_list

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "compose.yaml"
K8S = DEPLOY / "k8s"
ENTRYPOINT_SCRIPT = DEPLOY / "statefulset-broker.sh"
RECORD_TIMEOUT_S = 30.0

Address = tuple[str, int]


# --- the Dockerfile ------------------------------------------------------------------------------

def dockerfile_instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: comments dropped, continued lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, f"{path}: the last instruction ends in a line continuation"
    return out


def instruction_words(args: str) -> list[str]:
    """An instruction's arguments: the JSON (exec) form or shell words."""
    if args.startswith("["):
        words = yaml.safe_load(args)  # a JSON array is YAML too
        assert isinstance(words, list) and all(isinstance(w, str) for w in words), args
        return words
    return shlex.split(args)


def dockerignore_patterns(path: Path = ROOT / ".dockerignore") -> list[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def ignored_by(patterns: list[str], rel_path: str) -> str | None:
    """The .dockerignore pattern that keeps ``rel_path`` (or a folder above it) out of the build
    context, if any. Exception patterns ('!') are not used in ours and not handled."""
    parts = Path(rel_path).parts
    for pattern in patterns:
        assert not pattern.startswith("!"), f"exception patterns are not checked here: {pattern}"
        for depth in range(1, len(parts) + 1):
            prefix = "/".join(parts[:depth])
            plain = pattern.removeprefix("**/")
            if fnmatch.fnmatchcase(prefix, pattern) or (
                    pattern.startswith("**/") and fnmatch.fnmatchcase(parts[depth - 1], plain)):
                return pattern
    return None


def console_scripts() -> dict[str, str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        scripts: dict[str, str] = tomllib.load(f)["project"]["scripts"]
    return scripts


def package_patterns() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        found: list[str] = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]
    return found


# --- compose -------------------------------------------------------------------------------------

_COMPOSE_VAR = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}]*))?\}"
                          r"|\$(?P<bad>[^{$])")


def compose_interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation of ``$$``, ``${VAR}``, ``${VAR:-default}`` and ``${VAR-default}``
    (other forms are refused, so that the check never reads one wrongly)."""
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        if m.group("bad") is not None:
            raise ValueError(f"unsupported interpolation near {m.group(0)!r} in {text!r}")
        name, op, default = m.group("name"), m.group("op"), m.group("default")
        value = env.get(name)
        if op == ":-" and not value:
            return default
        if op == "-" and value is None:
            return default
        return value or ""
    return _COMPOSE_VAR.sub(one, text)


def load_compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    """compose.yaml as Compose reads it: interpolated with ``env`` (none by default), merge keys
    applied (PyYAML does), the extension fields (``x-...``) dropped."""
    data = yaml.safe_load(compose_interpolate(COMPOSE.read_text(), env or {}))
    assert isinstance(data, dict), f"{COMPOSE}: not a mapping"
    return {k: v for k, v in data.items() if not k.startswith("x-")}


def published_ports(service: dict[str, Any]) -> list[tuple[int, int]]:
    """(host port, container port) of a service's ``ports`` ("HOST:CONTAINER" strings)."""
    out = []
    for spec in service.get("ports", []):
        host, sep, container = str(spec).rpartition(":")
        assert sep and host.isdigit() and container.isdigit(), \
            f"port {spec!r}: write ports as \"HOST:CONTAINER\""
        out.append((int(host), int(container)))
    return out


# --- Kubernetes ----------------------------------------------------------------------------------

def k8s_documents() -> list[tuple[Path, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                assert isinstance(doc, dict), f"{path}: a document that is not a mapping"
                docs.append((path, doc))
    return docs


def k8s_objects(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in k8s_documents() if d["kind"] == kind}


_K8S_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def k8s_expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's expansion of ``$(VAR)`` in command, args and env values: a defined variable
    is replaced, an undefined reference stays as written, ``$$`` is a literal ``$``."""
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _K8S_VAR.sub(one, text)


_FIELD_REFS = {"metadata.name": "pod", "metadata.namespace": "namespace"}


def pod_environment(container: dict[str, Any], pod: str, namespace: str) -> dict[str, str]:
    """The container's environment as the kubelet makes it for pod ``pod`` of ``namespace``:
    HOSTNAME (the runtime sets it to the pod's name), then each ``env`` entry in order, a value
    (with ``$(VAR)`` of earlier entries expanded), a downward-API field of the pod, or a key of
    a Secret (a stand-in value)."""
    env = {"HOSTNAME": pod}
    facts = {"pod": pod, "namespace": namespace}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = k8s_expand(str(entry["value"]), env)
            continue
        secret = entry.get("valueFrom", {}).get("secretKeyRef")
        if secret is not None:  # (the operator's Secret: a stand-in value of the right shape)
            env[entry["name"]] = f"secret-{secret['name']}-{secret['key']}-" + "0" * 32
            continue
        path = entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        assert path in _FIELD_REFS, f"env {entry['name']}: only {sorted(_FIELD_REFS)} are rendered here"
        env[entry["name"]] = facts[_FIELD_REFS[path]]
    return env


def record_command(argv: list[str], env: dict[str, str], tmp_path: Path,
                   programs: dict[str, Path]) -> list[str]:
    """Run ``argv`` (a container's command, with ``programs``: name -> file, put on PATH as the
    image installs them) in ``env`` alone, with a ``dledger-broker`` that records its arguments
    instead of running; return what it was given. A command that fails raises with its stderr."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, source in programs.items():
        target = bin_dir / name
        if not target.exists():
            target.symlink_to(source)
    recorder = bin_dir / "dledger-broker"
    recorder.write_text("#!/bin/sh\nprintf '%s\\0' \"$@\" > \"$DLEDGER_TEST_ARGV\"\n")
    recorder.chmod(0o755)
    out = tmp_path / "argv"
    out.unlink(missing_ok=True)
    run_env = {**env, "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin",
               "DLEDGER_TEST_ARGV": str(out)}
    done = subprocess.run(argv, env=run_env, capture_output=True, text=True,
                          timeout=RECORD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise CommandFailed(done.returncode, done.stderr)
    assert out.exists(), f"{argv} exited 0 without running dledger-broker"
    return ["dledger-broker", *out.read_bytes().decode().split("\x00")[:-1]]


class CommandFailed(Exception):
    def __init__(self, returncode: int, stderr: str) -> None:
        super().__init__(f"exit {returncode}: {stderr.strip()}")
        self.returncode = returncode
        self.stderr = stderr


# --- the broker's and the NameServer's own parsers --------------------------------------------

@dataclass(frozen=True)
class BrokerArgs:
    """A ``dledger-broker start`` command line as the broker reads it."""
    node: NodeConfig
    listen: Address
    admin: Address
    advertise: Address | None
    grpc: Address | None
    namesrv: tuple[str, ...]
    params: dict[str, Any]


def parse_broker_command(argv: list[str]) -> BrokerArgs:
    """Parse with ``dledger-broker start``'s click command and build the NodeConfig and the
    addresses as ``start`` does, stopping before any server starts. Bad options raise the
    broker's own click errors."""
    assert argv[:2] == ["dledger-broker", "start"], f"not a `dledger-broker start` command: {argv}"
    ctx = broker_start.make_context("start", list(argv[2:]))
    p = ctx.params
    args = BrokerArgs(
        node=node_config(p), listen=parse_address(p["client_listen"]),
        admin=parse_address(p["admin_listen"]),
        advertise=_advertised(p["advertise"], "--advertise"),
        grpc=parse_address(p["grpc_listen"]) if p["grpc_listen"] else None,
        namesrv=parse_namesrv_list(p["namesrv"]) if p["namesrv"].strip() else (), params=p)
    # the broker's own checks of what it will register (a listener on every interface needs
    # an advertised address): a ValueError here is a start the broker would refuse
    BrokerConfig(args.node, args.listen, admin_listen=args.admin, namesrv=args.namesrv,
                 advertise_client=args.advertise,
                 advertise_admin=_advertised(p["admin_advertise"], "--admin-advertise"),
                 grpc_listen=args.grpc,
                 cluster_key=b"k" * 32)  # (every pod has one: test_deploy checks the manifests)
    return args


def parse_namesrv_command(argv: list[str]) -> Address:
    """The listen address of a ``dledger-namesrv start`` command, through its click command."""
    assert argv[:2] == ["dledger-namesrv", "start"], f"not a `dledger-namesrv start` command: {argv}"
    listen: Address = namesrv_cli.commands["start"].make_context("start", list(argv[2:])).params["listen"]
    return listen
