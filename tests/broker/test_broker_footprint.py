"""A broker process without the gRPC listener loads neither ``aiohttp`` nor ``prometheus_client``
(issue 37: together 15.7 MiB of a node's start): its admin endpoints, metrics and registrar are
the broker's own (``broker.shell``); nor ``importlib.metadata`` (the version is
``dledger.__version__``) nor ``tomllib`` (read only with ``--config``). Checked on the entry
modules in a fresh interpreter, and on real nodes of a group, through Python's own import log
(``PYTHONPROFILEIMPORTTIME``), which names every import a process makes, lazy ones included,
while they serve every endpoint, register, take sends and pulls and stop.

Nor, without TLS, OpenSSL (``dledger.openssl``: 4.7 MiB of a start): its library is not mapped in a
serving node, and a snapshot's SHA-256 loads it when first asked for."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.shell.http_client import HttpClient
from client import PullConsumer
from dledger.openssl import (
    CONFIG_BYTES_MAX,
    TLS_ENV,
    SslAbsentError,
    _AbsentSsl,
    asks_for_tls,
    config_paths,
)
from protocol.cluster_key import CLUSTER_KEY_ENV, status_headers
from protocol.tls import ENV_CA
from tests.clusters import namesrv_group

# (importlib.metadata: 3.5 MiB with the email, zipfile and csv modules it brings; tomllib: only
# with --config)
NOT_LOADED = ("aiohttp", "prometheus_client", "importlib.metadata", "tomllib")
ROOT = Path(__file__).resolve().parents[2]


def offenders(modules: list[str]) -> list[str]:
    return sorted(m for m in modules if any(m == x or m.startswith(x + ".") for x in NOT_LOADED))


def test_the_broker_entry_modules_import_neither() -> None:
    code = ("import json, sys\nimport broker.__main__, broker.server\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    assert "broker.shell.http_server" in loaded and "broker.shell.exposition" in loaded
    assert offenders(loaded) == []


def libcrypto_mapped(pid: int | str = "self") -> bool:
    """Whether OpenSSL's libcrypto is mapped into the process."""
    return "libcrypto" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize(("argv", "env", "tls"), [
    (["start", "--group", "a", "--listen", "127.0.0.1:0"], {}, False),
    (["start", "--tls-cert", "c.pem"], {}, True),
    (["start", "--TLS-CA=ca.pem"], {}, True),
    (["start", "--peer-mtls"], {}, True),
    (["start", "--config", "missing.toml"], {}, True),
    (["start", "--namesrv", "HTTPS://ns:9876"], {}, True),
    (["start"], {"DLEDGER_TLS_CA": "ca.pem"}, True),
    (["start"], {"DLEDGER_TLS_CA": ""}, False),
])
def test_what_asks_for_tls(argv: list[str], env: dict[str, str], tls: bool) -> None:
    assert TLS_ENV == ENV_CA  # (written twice: dledger.openssl must not import protocol.tls)
    assert asks_for_tls(argv, env) is tls


@pytest.mark.parametrize(("text", "tls"), [
    ('group = "a"\nid = "n0"\ndata-dir = "/var/lib/dledger"\n', False),
    ('group = "a"\ntls-cert = "/etc/dledger/n0.pem"\n', True),
    ('group = "a"\nTLS_CA = "ca.pem"\n', True),
    ('peer_mtls = true\n', True),
    ('namesrv = "HTTPS://ns:9876"\n', True),
    ('# TLS is terminated elsewhere\ngroup = "a"\n', True),  # (in doubt: loaded)
])
def test_a_config_file_asks_for_tls_if_it_says_so(tmp_path: Path, text: str, tls: bool) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    for argv in (["start", "--config", str(path)], ["start", f"--config={path}"]):
        assert asks_for_tls(argv, {}) is tls, argv
    assert config_paths(["start", "--config"]) == [""] and asks_for_tls(["--config"], {}) is True


def test_an_oversized_config_file_counts_as_asking(tmp_path: Path) -> None:
    path = tmp_path / "big.toml"
    path.write_bytes(b"# x\n" * (CONFIG_BYTES_MAX // 4 + 1))
    assert asks_for_tls(["start", "--config", str(path)], {}) is True


# A fresh interpreter imports the broker as its entry point does, given argv; prints whether
# ssl and libcrypto are there (with the event loop made), then whether a snapshot's SHA-256 is
# OpenSSL's and right.
_ENTRY = """
import json, sys
from dledger.openssl import sha256, unloaded_without_tls
with unloaded_without_tls(sys.argv[1:], {}) as left_out:
    import broker.cli, broker.server
from dledger import evloop
loop = (evloop.loop_factory() or __import__("asyncio").new_event_loop)()
mapped = lambda: "libcrypto" in open("/proc/self/maps").read()
out = {"left_out": left_out, "ssl": sys.modules.get("ssl") is not None, "libcrypto": mapped(),
       "loop": type(loop).__module__}
h = sha256(b"abc")
out.update(sha=h.hexdigest(), sha_type=type(h).__module__ + "." + type(h).__name__,
           libcrypto_after=mapped())
print(json.dumps(out))
"""
ABC_SHA256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def _entry(*argv: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", _ENTRY, *argv], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_without_tls_the_broker_loads_no_openssl_until_a_snapshot_digest() -> None:
    out = _entry("start", "--group", "a")
    assert out["left_out"] is True and out["ssl"] is False and out["libcrypto"] is False
    assert out["loop"] == "uvloop"  # (it imports ssl as it loads: dledger.openssl)
    assert out["sha"] == ABC_SHA256 and out["sha_type"] == "_hashlib.HASH"
    assert out["libcrypto_after"] is True


def test_a_config_file_without_tls_leaves_openssl_out(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text('group = "a"\nid = "n0"\n')
    out = _entry("start", "--config", str(path))
    assert out["left_out"] is True and out["libcrypto"] is False and out["loop"] == "uvloop"


def test_with_tls_asked_for_openssl_loads_as_usual() -> None:
    out = _entry("start", "--tls-cert", "c.pem")
    assert out["left_out"] is False and out["ssl"] is True and out["libcrypto"] is True
    assert out["loop"] == "uvloop" and out["sha"] == ABC_SHA256


def test_the_placeholder_ssl_makes_nothing() -> None:
    absent = _AbsentSsl("ssl")
    with pytest.raises(SslAbsentError, match="without TLS"):
        absent.SSLContext()
    with pytest.raises(SslAbsentError):
        absent.create_default_context()
    names = ["SSL_ERROR_WANT_READ", "SSL_ERROR_WANT_WRITE", "SSL_ERROR_SYSCALL",
             "SSL_ERROR_DAER_TNAW"]  # (the last an anagram of the first: still its own number)
    codes = [getattr(absent, n) for n in names]
    assert len(set(codes)) == len(names) and all(type(c) is int and c < 0 for c in codes)
    assert codes[0] == absent.SSL_ERROR_WANT_READ  # (the same name: the same number)
    assert absent.SSLError is absent.SSLError and not issubclass(absent.SSLError, OSError)


def test_import_without_ssl_leaves_ssl_absent_after() -> None:
    code = ("import sys\nsys.modules['ssl'] = None\n"
            "from dledger.openssl import import_without_ssl\n"
            "m = import_without_ssl('uvloop')\n"
            "print(m.__name__, sys.modules['ssl'], 'libcrypto' in open('/proc/self/maps').read())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["uvloop", "None", "False"]


def imported(log_text: str) -> list[str]:
    """The modules an import log (``PYTHONPROFILEIMPORTTIME``'s lines on stderr) names."""
    return [line.rsplit("|", 1)[1].strip() for line in log_text.splitlines()
            if line.startswith("import time:") and line.count("|") == 2]


@pytest.mark.slow
def test_running_nodes_import_neither(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # (read by the processes started here)
    with namesrv_group(tmp_path, "--protect-status") as (ns, cluster):  # registered, a send routed
        asyncio.run(_use_every_endpoint(ns, [s.ready["admin"] for s in cluster.servers.values()]))
        logs = [Path(s.log_path) for s in cluster.servers.values()]
        for server in cluster.servers.values():  # (no TLS in this group)
            assert server.pid is not None and not libcrypto_mapped(server.pid)
    for log in logs:  # read after the nodes stopped: their unregistration is in
        modules = imported(log.read_text(errors="replace"))
        assert "broker.shell.registrar" in modules and "asyncio" in modules, log
        assert "uvloop.loop" in modules, log  # (TLS off, ssl absent: still on uvloop)
        assert offenders(modules) == [], log


async def _use_every_endpoint(ns: str, admins: list[list[object]]) -> None:
    key = os.environ[CLUSTER_KEY_ENV].encode()  # (every process's: tests/conftest.py)
    http = HttpClient()
    for host, port in admins:
        base = f"http://{host}:{port}"
        for path in ("/livez", "/readyz", "/metrics"):
            resp = await http.request("GET", base + path, timeout_s=10)
            assert resp.status in (200, 503), (path, resp.status)
        signed = status_headers(key, int(time.time() * 1000))
        resp = await http.request("GET", base + "/status", headers=signed, timeout_s=10)
        assert resp.status == 200 and "raft" in json.loads(resp.body)
    await http.close()
    async with PullConsumer(ns, "footprint") as consumer:
        for mq in await consumer.fetch_queues("warmup"):
            await consumer.pull(mq, 0, 32)
