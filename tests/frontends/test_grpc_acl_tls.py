"""The gRPC endpoint with TLS and access control together (``--tls-*`` and ``--acl``): the
official RocketMQ 5 client with ``tls_enable=True``, trusting the test CA the way gRPC is told
to (``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``: the client's channel credentials use gRPC's default
roots), and with its credentials, sends and receives; the same client speaking plaintext to the
TLS port, or not trusting the CA, gets nothing through; with a wrong secret over TLS it is
refused UNAUTHORIZED.

Each official client runs in a process of its own, since gRPC reads the roots file once per
process. Every process is stopped by its PID; every wait has a deadline."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dledger.localcluster import LocalCluster
from dledger.network.tls_certs import make_ca, make_node_cert
from protocol.tls import ENV_CA
from tests.broker.test_broker_processes import BROKER
from tests.clusters import routed
from tests.frontends.test_grpc_acl import APP, ROOT, put_accounts

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("grpc-acl-tls")]

ROOT_DIR = Path(__file__).resolve().parents[2]
CLIENT_TIMEOUT_S = 90

# One official client's run: send a message, then (if sent) receive it with a simple consumer;
# prints {"sent": id, "received": [...]} or {"error": "..."} and, on refusal, the client's
# own log lines that name the endpoint's answer.
CLIENT = r"""
import json, logging, sys, time
from rocketmq import (ClientConfiguration, Credentials, FilterExpression, Message, Producer,
                      SimpleConsumer)
endpoints, ak, sk, tls, body = sys.argv[1:6]
tls = tls == "tls"
lines = []
class Keep(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())
logging.getLogger("rocketmq-python-client").addHandler(Keep())
cfg = ClientConfiguration(endpoints, Credentials(ak, sk), request_timeout=3)
out = {}
p = Producer(cfg, ["gacl-orders"], tls_enable=tls)
p.startup()
try:
    m = Message()
    m.topic, m.body, m.tag = "gacl-orders", body.encode(), "T"
    out["sent"] = p.send(m).message_id
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
    out["log"] = [l for l in lines if "exception" in l][:5]
finally:
    p.shutdown()
if "sent" in out:
    c = SimpleConsumer(cfg, "gacl-billing", {"gacl-orders": FilterExpression("T")},
                       await_duration=2, tls_enable=tls)
    c.startup()
    got, deadline = [], time.monotonic() + 30
    try:
        while body.encode() not in got and time.monotonic() < deadline:
            for r in c.receive(16, 30):
                got.append(r.body)
                c.ack(r)
    finally:
        c.shutdown()
    out["received"] = [g.decode() for g in got]
print(json.dumps(out))
"""


def start_namesrv(tls_args: tuple[str, ...]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "namesrv", "--listen", "127.0.0.1:0",
                             *tls_args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, text=True, cwd=ROOT_DIR)
    assert proc.stdout is not None
    host, port = json.loads(proc.stdout.readline())["listen"]
    return proc, f"{host}:{port}"


def grpc_endpoint(ns: str, ca: str) -> str | None:
    ctx = ssl.create_default_context(cafile=ca)
    with urllib.request.urlopen(f"https://{ns}/v1/cluster", timeout=5, context=ctx) as resp:
        groups = json.loads(resp.read())["groups"]
    found = [n["grpc_address"] for g in groups for n in g["nodes"] if "grpc_address" in n]
    return found[0] if found else None


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(the node's gRPC endpoint, the CA file) of a NameServer and a one-node group with TLS
    on every listener and --acl."""
    base = tmp_path_factory.mktemp("grpc-acl-tls")
    pki = str(base / "pki")
    ca = make_ca(pki)
    cert = make_node_cert(pki, "node", ("127.0.0.1",))
    tls_args = ("--tls-cert", cert.cert_file, "--tls-key", cert.key_file, "--tls-ca", ca)
    patch = pytest.MonkeyPatch()
    patch.setenv("DLEDGER_ACL_SECRET_ROOT", ROOT.secret_key)
    patch.setenv("DLEDGER_ACCESS_KEY", ROOT.access_key)  # (our client's routing warm-up)
    patch.setenv("DLEDGER_SECRET_KEY", ROOT.secret_key)
    patch.setenv(ENV_CA, ca)
    ns_proc, ns = start_namesrv(tls_args)
    try:
        with LocalCluster(str(base / "a"), size=1, tick_ms=50, group="a",
                          program=(*BROKER, "--grpc-listen", "127.0.0.1:0", "--acl",
                                   "--acl-admin-key", "root", *tls_args, "--namesrv", ns,
                                   "--register-interval-s", "1")):
            asyncio.run(routed(ns))
            patch.delenv("DLEDGER_ACCESS_KEY")
            patch.delenv("DLEDGER_SECRET_KEY")
            asyncio.run(put_accounts(ns, tls_ca=ca))
            deadline = time.monotonic() + 30
            while (endpoint := grpc_endpoint(ns, ca)) is None:
                assert time.monotonic() < deadline, "the node's gRPC address not registered"
                time.sleep(0.1)  # (polling the NameServer: a condition with a deadline)
            yield endpoint, ca
    finally:
        ns_proc.terminate()
        ns_proc.wait(timeout=10)
        patch.undo()


def official(endpoint: str, secret: str, tls: bool, roots: str | None, body: str) -> dict[str, Any]:
    """One official client's run in a process of its own (see ``CLIENT``)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", ENV_CA)}
    if roots is not None:
        env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = roots
    done = subprocess.run([sys.executable, "-c", CLIENT, endpoint, APP.access_key, secret,
                           "tls" if tls else "plain", body], capture_output=True, text=True,
                          env=env, timeout=CLIENT_TIMEOUT_S, cwd=ROOT_DIR)
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_official_client_over_tls_with_its_credentials_sends_and_receives(
        tls_cluster: tuple[str, str]) -> None:
    endpoint, ca = tls_cluster
    ok = official(endpoint, APP.secret_key, tls=True, roots=ca, body="over-tls")
    assert ok.get("sent") and "over-tls" in ok.get("received", []), ok


def test_plaintext_or_an_untrusted_certificate_gets_nothing_through(
        tls_cluster: tuple[str, str]) -> None:
    endpoint, ca = tls_cluster
    plain = official(endpoint, APP.secret_key, tls=False, roots=ca, body="plaintext")
    assert "sent" not in plain and "failed to fetch topic" in plain["error"], plain
    assert any("UNAVAILABLE" in line for line in plain["log"]), plain  # (the port closes)
    untrusted = official(endpoint, APP.secret_key, tls=True, roots=None, body="untrusted")
    assert "sent" not in untrusted and "failed to fetch topic" in untrusted["error"], untrusted
    assert any("CERTIFICATE_VERIFY_FAILED" in line for line in untrusted["log"]), untrusted
    # the control: the same client, TLS on and the CA trusted, gets through
    ok = official(endpoint, APP.secret_key, tls=True, roots=ca, body="trusted")
    assert ok.get("sent"), ok


def test_a_wrong_secret_over_tls_is_refused_unauthorized(tls_cluster: tuple[str, str]) -> None:
    endpoint, ca = tls_cluster
    wrong = official(endpoint, "not-the-secret", tls=True, roots=ca, body="wrong-secret")
    assert "sent" not in wrong, wrong
    assert any("40100" in line and "signature does not match" in line
               for line in wrong["log"]), wrong
