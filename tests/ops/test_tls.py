"""TLS (docs/tls.md): the test CA helper, the settings' checks and the dialer's rule, mutual TLS
on the peer listener, and a live ``dledger up --tls`` cluster (NameServer + a 3-node group) that
the client library, the CLI, the admin HTTP and the gRPC endpoint reach over TLS, while a client
without the CA, with another CA, or speaking plain TCP is refused with a named error.

Every wait is on a condition with a deadline; processes are stopped by their PIDs.
"""

from __future__ import annotations

import asyncio
import os
import random
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from cli import main as dledger_main
from client import Message, Producer, PullConsumer, TlsError, UnavailableError
from dledger.client import LogClient
from dledger.localcluster import LocalCluster
from dledger.network.tls_certs import CA_CERT, make_ca, make_node_cert
from dledger.network.transport import PeerTransport
from dledger.network.wire import Hello, encode_message
from dledger.raft.types import Heartbeat
from dledger.raft.types import Message as RaftMessage
from protocol import broker_kinds as bp
from protocol.errors import NodeStoppedError, OutcomeUnknownError
from protocol.errors import TlsError as LogTlsError
from protocol.frames import encode_frame
from protocol.tls import ENV_CA, TlsConfig, TlsConfigError, client_context, dial_context, split_https
from tests.cli.up_process import UpProcess
from tests.clusters import console_ok
from tests.nodes.test_processes import leader_of, wait_until

HOST = "127.0.0.1"


def _load(path: str) -> x509.Certificate:
    with open(path, "rb") as f:
        return x509.load_pem_x509_certificate(f.read())


# -- the certificate helper and the settings ---------------------------------------------------


def test_node_certificates_chain_to_the_ca_and_name_the_hosts(tmp_path: Path) -> None:
    ca_file = make_ca(str(tmp_path))
    node = make_node_cert(str(tmp_path), "a-n0", ("127.0.0.1", "localhost", "broker-0.example"))
    ca, cert = _load(ca_file), _load(node.cert_file)
    cert.verify_directly_issued_by(ca)  # raises if the signature or issuer is wrong
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert sans.get_values_for_type(x509.DNSName) == ["localhost", "broker-0.example"]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usage) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert oct(os.stat(node.key_file).st_mode & 0o777) == "0o600"
    assert oct(os.stat(tmp_path / "ca-key.pem").st_mode & 0o777) == "0o600"


def test_make_ca_keeps_an_existing_ca_and_bad_names_are_refused(tmp_path: Path) -> None:
    make_ca(str(tmp_path))
    before = (tmp_path / CA_CERT).read_bytes()
    with pytest.raises(FileExistsError):
        make_ca(str(tmp_path))
    assert (tmp_path / CA_CERT).read_bytes() == before
    for bad in ("", "../x", ".hidden"):
        with pytest.raises(ValueError):
            make_node_cert(str(tmp_path), bad)
    with pytest.raises(ValueError):
        make_node_cert(str(tmp_path), "n0", hosts=())


def test_tls_options_must_come_together_and_fit(tmp_path: Path) -> None:
    ca = make_ca(str(tmp_path / "ca"))
    n0 = make_node_cert(str(tmp_path / "ca"), "n0")
    n1 = make_node_cert(str(tmp_path / "ca"), "n1")
    assert TlsConfig.from_options(None, None, None) is None
    config = TlsConfig.from_options(n0.cert_file, n0.key_file, ca, peer_mtls=True)
    assert config is not None and config.peer_mtls
    assert config.server_context().minimum_version == ssl.TLSVersion.TLSv1_2
    assert config.peer_server_context().verify_mode == ssl.CERT_REQUIRED
    assert config.server_context().verify_mode == ssl.CERT_NONE  # clients bring no certificate
    with pytest.raises(TlsConfigError, match="all of"):
        TlsConfig.from_options(n0.cert_file, None, ca)
    with pytest.raises(TlsConfigError, match="--peer-mtls needs"):
        TlsConfig.from_options(None, None, None, peer_mtls=True)
    with pytest.raises(TlsConfigError, match="not a readable file"):
        TlsConfig.from_options(n0.cert_file, n0.key_file, str(tmp_path / "missing.pem"))
    with pytest.raises(TlsConfigError, match="cannot load the certificate"):
        TlsConfig.from_options(n0.cert_file, n1.key_file, ca)  # n1's key with n0's certificate


def test_a_dialer_speaks_tls_with_a_ca_or_an_https_address(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    ca = make_ca(str(tmp_path))
    monkeypatch.delenv(ENV_CA, raising=False)
    assert dial_context(None) is None
    assert dial_context(ca) is not None
    system = dial_context(None, https=True)  # the system's trust store
    assert system is not None and system.check_hostname
    monkeypatch.setenv(ENV_CA, ca)
    assert dial_context(None, from_env=False) is None  # a server's own client: its options only
    ctx = dial_context(None)
    assert ctx is not None and ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert split_https(["https://a:1;b:2", "c:3"]) == (["a:1", "b:2", "c:3"], True)
    assert split_https(["a:1,b"]) == (["a:1", "b"], False)
    with pytest.raises(TlsConfigError, match="CA file"):
        client_context(str(tmp_path / "missing.pem"))


# -- mutual TLS on the peer listener ---------------------------------------------------------


async def _dial_as_peer(port: int, ctx: ssl.SSLContext) -> bytes | None:
    """Dial the peer listener as n1 with ``ctx``, say Hello and send one heartbeat; then read:
    None if the listener kept the connection (a peer link is write-only: nothing comes back),
    b"" or an SSLError's text if it closed it."""
    reader, writer = await asyncio.open_connection(HOST, port, ssl=ctx, server_hostname=HOST)
    writer.write(encode_frame(encode_message(Hello("g", "n1", f"{HOST}:1"))))
    writer.write(encode_frame(encode_message(Heartbeat(src="n1", dst="n0", term=1, commit=0))))
    try:
        async with asyncio.timeout(5.0):  # (one loop runs both ends: a stall must not read
            got = await reader.read()      # as a closed connection)
    except TimeoutError:
        got = None  # still open
    except (ssl.SSLError, ConnectionResetError) as err:
        got = str(err).encode()
    writer.close()
    return got


def test_peer_mtls_takes_only_peers_with_a_certificate_of_the_ca(tmp_path: Path) -> None:
    ca = make_ca(str(tmp_path / "ca"))
    n0, n1 = (make_node_cert(str(tmp_path / "ca"), n) for n in ("n0", "n1"))
    other_ca = make_ca(str(tmp_path / "other"))
    stranger = make_node_cert(str(tmp_path / "other"), "n1")
    config = TlsConfig(n0.cert_file, n0.key_file, ca, peer_mtls=True)

    async def main() -> None:
        inbox: list[RaftMessage] = []
        transport = PeerTransport("n0", "g", (HOST, 0), {}, inbox.append, rng=random.Random(1),
                                  server_ssl=config.peer_server_context(),
                                  dial_ssl=config.peer_client_context())
        _, port = await transport.start()
        try:
            foreign = client_context(other_ca, stranger.cert_file, stranger.key_file)
            foreign.check_hostname, foreign.verify_mode = False, ssl.CERT_NONE  # it trusts all
            assert await _dial_as_peer(port, foreign) is not None  # closed by n0
            no_cert = client_context(ca)  # trusts n0, presents nothing
            assert await _dial_as_peer(port, no_cert) is not None
            assert inbox == []
            member = client_context(ca, n1.cert_file, n1.key_file)
            assert await _dial_as_peer(port, member) is None  # kept open: a peer link
            await wait_until(lambda: len(inbox) == 1, 5, "the member's heartbeat delivered")
            assert inbox[0].src == "n1"
            with pytest.raises(ssl.SSLError):  # n0's certificate is not of the other CA
                await asyncio.open_connection(HOST, port, ssl=client_context(other_ca),
                                              server_hostname=HOST)
        finally:
            await transport.stop()

    asyncio.run(asyncio.wait_for(main(), 20))


@pytest.mark.slow
def test_dledger_log_speaks_tls_to_a_bare_log_group(tmp_path: Path) -> None:
    ca = make_ca(str(tmp_path / "ca"))
    node = make_node_cert(str(tmp_path / "ca"), "node")  # 127.0.0.1 and localhost: every node
    tls_args = ("--tls-cert", node.cert_file, "--tls-key", node.key_file, "--tls-ca", ca)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop(ENV_CA, None)
    with LocalCluster(str(tmp_path / "g"), size=3, tick_ms=50, extra_args=tls_args) as cluster:
        async def elected() -> None:
            async with LogClient(cluster.client_addresses, ssl_context=client_context(ca)) as c:
                await wait_until(lambda: leader_of(c, cluster), 20, "a leader")
        _arun(elected())
        nodes = ",".join(f"{n}={h}:{p}" for n, (h, p) in cluster.client_addresses.items())
        cmd = [sys.executable, "-c", "import cli; cli.main()", "log", "status", "--nodes", nodes]
        ok = subprocess.run([*cmd, "--tls-ca", ca], capture_output=True, text=True, env=env,
                            timeout=60)
        assert ok.returncode == 0 and " leader " in ok.stdout, ok.stdout + ok.stderr
        plain = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
        assert plain.returncode == 2 and plain.stdout.count("unreachable") == 3, plain.stdout


# -- a live cluster: dledger up --tls --------------------------------------------------------


@pytest.fixture(scope="module")
def tls_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[UpProcess, str]]:
    """``dledger up --tls`` (a NameServer and a 3-node group, mutual TLS between peers)."""
    data_dir = tmp_path_factory.mktemp("tls-up")
    up = UpProcess(data_dir, "--tls")
    try:
        up.ready()
        ca = up.wait_for(r"export DLEDGER_TLS_CA=(\S+)").group(1)
        yield up, ca
    finally:
        up.cleanup()


def _arun(coro: Awaitable[Any], timeout_s: float = 60.0) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(coro, timeout_s)
    return asyncio.run(bounded())


async def _send_until_routed(p: Producer, topic: str, body: bytes, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await p.send(Message(topic, body))
        except UnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)  # the route of a new topic shows within a second


@pytest.mark.slow
def test_up_tls_serves_the_client_library_end_to_end(tls_up: tuple[UpProcess, str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    up, ca = tls_up
    monkeypatch.delenv(ENV_CA, raising=False)
    assert "admin https://" in up.output()
    listed = CliRunner().invoke(dledger_main, ["node", "list", "--data-dir", str(up.data_dir)])
    assert listed.exit_code == 0 and listed.output.count("admin https://") == 3, listed.output

    async def main() -> list[bytes]:
        async with Producer(up.namesrv, tls_ca=ca) as p:
            await _send_until_routed(p, "tls-topic", b"m0")
            for i in range(1, 20):
                await p.send(Message("tls-topic", f"m{i}".encode()))
        got: list[bytes] = []
        async with PullConsumer(up.namesrv, "tls-group", tls_ca=ca) as c:
            for mq in await c.fetch_queues("tls-topic"):
                offset = 0
                for _ in range(20):  # bounded: 20 messages at most in all
                    r = await c.pull(mq, offset)
                    got += [m.body for m in r.messages]
                    if r.next_offset == offset or offset >= r.max_offset:
                        break
                    offset = r.next_offset
        return got

    got = _arun(main())
    assert sorted(got) == sorted(f"m{i}".encode() for i in range(20))
    monkeypatch.setenv(ENV_CA, ca)  # the environment alone is enough too

    async def by_env() -> None:
        async with Producer(up.namesrv) as p:
            await p.send(Message("tls-topic", b"by-env"))
    _arun(by_env())


@pytest.mark.slow
def test_clients_without_the_ca_are_refused_with_a_named_error(
        tls_up: tuple[UpProcess, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    up, ca = tls_up
    monkeypatch.delenv(ENV_CA, raising=False)
    other_ca = make_ca(str(tmp_path / "other"))

    async def start(namesrv: str, tls_ca: str | None) -> None:
        async with Producer(namesrv, tls_ca=tls_ca) as p:
            await p.send(Message("tls-refused", b"never"))

    with pytest.raises(TlsError, match="certificate not trusted"):
        _arun(start(up.namesrv, other_ca))  # the wrong CA
    with pytest.raises(TlsError, match="certificate not trusted"):
        _arun(start(f"https://{up.namesrv}", None))  # TLS, but the system's trust store
    with pytest.raises(UnavailableError, match="speaks TLS closes plain connections"):
        _arun(start(up.namesrv, None))  # no TLS at all

    # The brokers' client ports: with another CA a named error at once; plain TCP gets no answer.
    node = up.node("a", "n0")
    host, port = node["client"].rsplit(":", 1)
    addr = {"n0": (host, int(port))}

    async def status(ctx: ssl.SSLContext | None) -> Any:
        async with LogClient(addr, timeout_s=3.0, ssl_context=ctx) as lc:
            return await lc.call("n0", bp.BROKER_STATUS)

    with pytest.raises(LogTlsError, match="certificate verify failed"):
        _arun(status(client_context(other_ca)))
    with pytest.raises((NodeStoppedError, OutcomeUnknownError)):
        _arun(status(None))
    assert _arun(status(client_context(ca)))  # the same port, with the CA: answered

    async def topics() -> Any:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                ssl=client_context(ca))) as s, s.get(f"https://{up.namesrv}/v1/topics") as r:
            return await r.json()
    assert "tls-refused" not in str(_arun(topics()))  # no refused send created its topic


@pytest.mark.slow
def test_admin_http_cli_and_grpc_speak_tls(tls_up: tuple[UpProcess, str]) -> None:
    up, ca = tls_up
    admin = up.node("a", "n1")["admin"]

    async def get(url: str, ctx: ssl.SSLContext | bool) -> int:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5),
                                         connector=aiohttp.TCPConnector(ssl=ctx)) as s, s.get(url) as resp:
            return resp.status

    assert _arun(get(f"https://{admin}/status", client_context(ca))) == 200
    assert _arun(get(f"https://localhost:{admin.rsplit(':', 1)[1]}/livez",
                     client_context(ca))) == 200  # the SAN localhost
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        _arun(get(f"https://{admin}/status", True))
    with pytest.raises(aiohttp.ClientError):
        _arun(get(f"http://{admin}/status", True))

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop(ENV_CA, None)
    cmd = [sys.executable, "-c", "import cli; cli.main()", "status", "--namesrv", up.namesrv]
    deadline = time.monotonic() + 30  # (a node slow to answer one round reads as degraded)
    while True:
        ok = subprocess.run([*cmd, "--tls-ca", ca], capture_output=True, text=True, env=env,
                            timeout=60)
        if (ok.returncode == 0 and "health: ok" in ok.stdout) or time.monotonic() > deadline:
            break
        time.sleep(0.5)  # polling the cluster until every node answers in one round
    assert ok.returncode == 0 and "health: ok" in ok.stdout, ok.stdout + ok.stderr
    refused = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert refused.returncode != 0 and "give --tls-ca" in refused.stderr, refused.stderr

    import grpc  # the gRPC endpoint: TLS with the CA, refused without
    endpoint = up.wait_for(r'endpoints "([^";]+)').group(1)
    with open(ca, "rb") as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    with grpc.secure_channel(endpoint, creds) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
    query_route = "/apache.rocketmq.v2.MessagingService/QueryRoute"
    # plain HTTP/2 to the TLS port
    with grpc.insecure_channel(endpoint) as channel, pytest.raises(grpc.RpcError) as refused_rpc:
        channel.unary_unary(query_route)(b"", timeout=10)
    assert refused_rpc.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.slow
def test_the_console_and_metrics_work_over_tls(tls_up: tuple[UpProcess, str]) -> None:
    """The NameServer's console reaches the brokers' admin endpoints over https and its client
    calls carry the CA; /metrics is served over https too."""
    up, ca = tls_up

    async def get(path: str) -> tuple[int, Any]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15),
                                         connector=aiohttp.TCPConnector(ssl=client_context(ca))) as s, \
                s.get(f"https://{up.namesrv}{path}") as resp:
            body = await resp.json() if path.startswith("/console/api") else await resp.text()
            return resp.status, body

    async def snapshot() -> dict[str, Any]:
        status, snap = await get("/console/api/snapshot")
        assert status == 200
        return dict(snap)
    _arun(console_ok(snapshot))  # every node's /status read over https
    status, topics = _arun(get("/console/api/topics"))
    assert status == 200, topics

    async def counted() -> bool:
        status, text = await get("/metrics")
        return status == 200 and "dledger_namesrv_nodes 3.0" in text
    _arun(wait_until(counted, 30, "the NameServer's metrics to count 3 nodes"))


def test_tls_make_ca_command_writes_a_ca_and_node_certificates(tmp_path: Path) -> None:
    from click.testing import CliRunner

    import cli

    runner = CliRunner()
    res = runner.invoke(cli.main, ["tls", "make-ca", str(tmp_path / "pki"), "--node", "n0",
                                   "--host", "10.1.2.3"])
    assert res.exit_code == 0, res.output
    assert f"DLEDGER_TLS_CA={tmp_path / 'pki' / 'ca.pem'}" in res.output
    sans = _load(str(tmp_path / "pki" / "n0.pem")).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.1.2.3"]
    again = runner.invoke(cli.main, ["tls", "make-ca", str(tmp_path / "pki")])
    assert again.exit_code != 0 and "already holds a CA" in again.output
    more = runner.invoke(cli.main, ["tls", "make-cert", str(tmp_path / "pki"), "n1"])
    assert more.exit_code == 0 and (tmp_path / "pki" / "n1-key.pem").is_file(), more.output
