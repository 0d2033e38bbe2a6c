"""The container engine and the compose cluster for tests/deploy/test_containers.py: which engine
this machine has (or why none), building the image with deploy/build-image.sh, a compose project
of deploy/compose.yaml started by podman-compose under a project name of its own with ports
chosen free at test time, its containers found by their compose labels (never by name
patterns), and its teardown by project and container ids. podman runs with
deploy/podman/containers.conf (runc, cgroupfs, the sandbox's ulimits)."""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dledger.localcluster import free_ports
from protocol.cluster_key import CLUSTER_KEY_ENV

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose.yaml"
BUILD_SCRIPT = ROOT / "deploy" / "build-image.sh"
CONTAINERS_CONF = ROOT / "deploy" / "podman" / "containers.conf"
BROKERS = ("a0", "a1", "a2", "b0", "b1", "b2")
ENGINE_TIMEOUT_S = 120.0
BUILD_TIMEOUT_S = 900.0  # a cold build: debootstrap (about a minute) and the wheelhouse
SERVICE_LABEL = "com.docker.compose.service"
PROJECT_LABEL = "io.podman.compose.project"


def engine_env() -> dict[str, str]:
    """The environment podman and podman-compose run in: the repository's containers.conf
    unless the caller chose one."""
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    return env


def podman_compose_argv() -> list[str] | None:
    """How to run podman-compose: the module beside this interpreter, else one on PATH."""
    if importlib.util.find_spec("podman_compose") is not None:
        return [sys.executable, "-m", "podman_compose"]
    found = shutil.which("podman-compose")
    return [found] if found else None


def missing_engine() -> str | None:
    """Why the container test cannot run here (None: it can)."""
    for tool, how in (("podman", "apt-get install podman"), ("runc", "apt-get install runc"),
                      ("debootstrap", "apt-get install debootstrap")):
        if shutil.which(tool) is None:
            return f"no container engine: {tool} is not installed ({how}; .ci/run does)"
    if podman_compose_argv() is None:
        return "podman-compose is not installed (pip install podman-compose: a dev dependency)"
    if os.geteuid() != 0:
        return "the container test runs podman as root (the sandbox's podman is rootful)"
    done = subprocess.run(["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"],
                          env=engine_env(), capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S,
                          check=False)
    if done.returncode != 0:
        return f"podman does not run here: {done.stderr.strip()[-300:]}"
    return None


def require_engine(reason: str | None) -> None:
    """Go on when ``reason`` is None; else fail under CI=true (CI installs the engine: its
    absence there is a broken run), skip elsewhere, naming the reason."""
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


def podman(*args: str, timeout_s: float = ENGINE_TIMEOUT_S, check: bool = True) -> str:
    done = subprocess.run(["podman", *args], env=engine_env(), capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


# Lines the engine prints on every start in a sandbox without systemd (it cannot arm health
# check timers; the tests run the checks themselves) and that would crowd out a real error.
NOISE = ("unable to get systemd connection", "doesn't support healthy", "failed to connect to syslog")


def telling(text: str, limit: int = 3000) -> str:
    """The engine's output without its known noise, its last ``limit`` characters."""
    kept = "\n".join(line for line in text.splitlines() if not any(n in line for n in NOISE))
    return kept[-limit:]


@dataclass
class Built:
    tag: str
    output: str  # the script's lines: the steps with their times, the image's size
    seconds: float


def build_image(tag: str) -> Built:
    """deploy/build-image.sh --tag ``tag``, with this interpreter's Python for the wheelhouse."""
    import time
    t0 = time.monotonic()
    done = subprocess.run([str(BUILD_SCRIPT), "--tag", tag], env={**engine_env(), "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    assert done.returncode == 0, f"build-image.sh failed:\n{done.stdout}\n{done.stderr}"
    return Built(tag, done.stdout.strip(), time.monotonic() - t0)


@dataclass
class ComposeCluster:
    """A compose project of deploy/compose.yaml: its name, the ports its services publish."""

    project: str
    image: str
    ports: dict[str, int]  # DLEDGER_*_PORT variable -> host port
    cluster_key: str = field(default_factory=lambda: secrets.token_hex(32))
    refused_starts: list[str] = field(default_factory=list)  # errors of starts tried before this one

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.ports['DLEDGER_NAMESRV_PORT']}"

    def admin(self, service: str) -> str:
        return f"127.0.0.1:{self.ports[f'DLEDGER_{service.upper()}_ADMIN_PORT']}"

    def env(self) -> dict[str, str]:
        return {**engine_env(), **{k: str(v) for k, v in self.ports.items()},
                "DLEDGER_IMAGE": self.image, "DLEDGER_ADVERTISE_HOST": "127.0.0.1",
                CLUSTER_KEY_ENV: self.cluster_key}

    def compose(self, *args: str, timeout_s: float = ENGINE_TIMEOUT_S) -> str:
        argv = podman_compose_argv()
        assert argv is not None
        done = subprocess.run([*argv, "-p", self.project, "-f", str(COMPOSE), *args], env=self.env(),
                              capture_output=True, text=True, timeout=timeout_s, check=False)
        assert done.returncode == 0, f"podman-compose {' '.join(args)}: exit {done.returncode}:\n" \
                                     f"{telling(done.stdout)}\n{telling(done.stderr)}"
        return done.stdout

    def containers(self) -> dict[str, str]:
        """service -> container id, of this project's containers (running or not)."""
        rows = json.loads(podman("ps", "-a", "--filter", f"label={PROJECT_LABEL}={self.project}",
                                 "--format", "json") or "[]")
        return {row["Labels"][SERVICE_LABEL]: row["Id"] for row in rows}

    def state(self, service: str) -> dict[str, object]:
        state: dict[str, object] = json.loads(podman("inspect", "--format", "{{json .State}}",
                                                     self.containers()[service]))
        return state

    def volume_path(self, service: str) -> Path:
        """Where the service's volume lies on this host (a rootful engine's storage)."""
        name = f"{self.project}_{service}-data"
        return Path(podman("volume", "inspect", "--format", "{{.Mountpoint}}", name).strip())

    def down(self) -> None:
        """Remove this project's containers, network and volumes: through podman-compose, then
        whatever is left by the project's label and by id (the anonymous volume the image's
        VOLUME gives the NameServer's container too)."""
        ids = list(self.containers().values())
        mounted = podman("inspect", "--format", "{{range .Mounts}}{{.Name}} {{end}}", *ids,
                         check=False).split() if ids else []
        try:
            self.compose("down", "-v", "-t", "10", timeout_s=300)
        finally:
            left = list(self.containers().values())
            if left:
                podman("rm", "-f", "-t", "5", *left, check=False)
            vols = podman("volume", "ls", "-q", "--filter", f"label={PROJECT_LABEL}={self.project}",
                          check=False).split()
            present = set(podman("volume", "ls", "-q", check=False).split())
            gone = [v for v in {*vols, *mounted} if v in present]
            if gone:
                podman("volume", "rm", "-f", *gone, check=False)


UP_ATTEMPTS = 2


def fresh_cluster(image: str) -> ComposeCluster:
    """A new project name and every published port chosen free now."""
    names = ["DLEDGER_NAMESRV_PORT"] + [f"DLEDGER_{s.upper()}{kind}_PORT" for s in BROKERS
                                        for kind in ("", "_GRPC", "_ADMIN")]
    return ComposeCluster(f"dledger-test-{secrets.token_hex(4)}", image,
                          dict(zip(names, free_ports(len(names)))))


@contextmanager
def compose_cluster(image: str) -> Iterator[ComposeCluster]:
    """deploy/compose.yaml up under a fresh project name, every published port chosen free now;
    down (with its volumes) at the end. A start the engine refuses (a port another test took
    between the choice and the bind, for one) is taken down and tried once more under a new
    name and new ports; the cluster keeps the refused starts' errors (``refused_starts``)."""
    refused_starts: list[str] = []
    for attempt in range(1, UP_ATTEMPTS + 1):
        cluster = fresh_cluster(image)
        cluster.refused_starts = refused_starts
        try:
            cluster.compose("up", "-d", "--no-build", timeout_s=300)
        except AssertionError as refused:
            cluster.down()
            refused_starts.append(str(refused))
            if attempt == UP_ATTEMPTS:
                raise AssertionError("\n---\n".join(refused_starts)) from refused
            continue
        try:
            yield cluster
        finally:
            cluster.down()
        return
