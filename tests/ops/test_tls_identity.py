"""Certificate rotation and peer identity in one process (docs/tls.md): the identity rule and its
check (pure), what a SIGHUP's reload checks and logs, ``TlsConfig.reload`` on a listener that is
already serving (new handshakes get the new certificate, open connections keep theirs, bad files
change nothing), and ``--peer-mtls``'s identity check on the peer transport in both directions.
Each check has its negative control. Every wait has a deadline; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import random
import ssl
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli import main as dledger_main
from cli.tls import UpTls
from dledger.network.peer_identity import (
    PeerIdentityError,
    check_peer,
    named_nodes,
    node_uri,
)
from dledger.network.tls_certs import NodeCert, make_ca, make_node_cert
from dledger.network.tls_reload import CertificateInfo, TlsReloader, check_new, read_certificate
from dledger.network.transport import PeerTransport
from dledger.network.wire import Hello, encode_message
from dledger.raft.types import Heartbeat
from dledger.raft.types import Message as RaftMessage
from protocol.frames import encode_frame
from protocol.tls import TlsConfig, TlsConfigError, client_context
from tests.nodes.test_processes import wait_until

HOST = "127.0.0.1"


def _run(coro: Awaitable[Any]) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(coro, 30)
    return asyncio.run(bounded())


def _serial(cert: NodeCert) -> str:
    return read_certificate(cert.cert_file).serial


def _replace(src: NodeCert, dst: NodeCert) -> None:
    """Put ``src``'s files where ``dst``'s are, each by an atomic rename (what a rotation does)."""
    os.replace(src.key_file, dst.key_file)
    os.replace(src.cert_file, dst.cert_file)


# -- the rule (pure) -----------------------------------------------------------------------------


def _peercert(*sans: tuple[str, str], cn: str = "x", serial: str = "0A") -> dict[str, Any]:
    """A certificate as ssl's getpeercert() shows a verified peer's."""
    return {"subject": ((("commonName", cn),),), "serialNumber": serial,
            "subjectAltName": sans}


def test_a_node_is_named_by_a_uri_of_its_group_and_id() -> None:
    assert node_uri("a", "n0") == "dledger-node:a/n0"
    assert node_uri("g/x", "n 1") == "dledger-node:g%2Fx/n%201"  # parts cannot run together
    assert node_uri("g", "x/n1") != node_uri("g/x", "n1")
    for group, nid in (("", "n0"), ("a", "")):
        with pytest.raises(ValueError):
            node_uri(group, nid)


def test_the_check_reads_only_dledger_node_uris() -> None:
    cert = _peercert(("IP Address", "127.0.0.1"), ("DNS", "dledger-node:a/n1"),
                     ("URI", "https://a/n1"), ("URI", "dledger-node:a/n0"), cn="n1")
    assert named_nodes(cert) == ("dledger-node:a/n0",)
    check_peer(cert, "a", "n0")
    # Negative controls: a DNS name, another scheme and the common name do not name n1.
    with pytest.raises(PeerIdentityError, match=r"names dledger-node:a/n0, not dledger-node:a/n1"):
        check_peer(cert, "a", "n1")
    with pytest.raises(PeerIdentityError):
        check_peer(cert, "b", "n0")  # the same node id in another group
    with pytest.raises(PeerIdentityError, match="no verified certificate"):
        check_peer(None, "a", "n0")
    with pytest.raises(PeerIdentityError, match="names no node"):
        check_peer(_peercert(("DNS", "localhost")), "a", "n0")
    several = _peercert(("URI", "dledger-node:a/n0"), ("URI", "dledger-node:a/n1"))
    check_peer(several, "a", "n0")
    check_peer(several, "a", "n1")


def _info(nodes: tuple[str, ...] = ("dledger-node:a/n0",), days_left: float = 30,
          days_since: float = 1) -> CertificateInfo:
    now = datetime.datetime.now(datetime.UTC)
    return CertificateInfo("CN=a-n0", "0A", now - datetime.timedelta(days=days_since),
                           now + datetime.timedelta(days=days_left), nodes)


def test_a_new_certificate_must_be_valid_now_and_name_this_node() -> None:
    now = datetime.datetime.now(datetime.UTC)
    check_new(_info(), now, ("a", "n0"))
    check_new(_info(nodes=()), now, None)  # no --peer-mtls: no identity asked
    with pytest.raises(PeerIdentityError, match="names dledger-node:a/n1, not this node"):
        check_new(_info(nodes=("dledger-node:a/n1",)), now, ("a", "n0"))
    with pytest.raises(TlsConfigError, match="expired"):
        check_new(_info(days_left=-1), now, None)
    with pytest.raises(TlsConfigError, match="not valid before"):
        check_new(_info(days_since=-1), now, None)


# -- the certificate helper names nodes ---------------------------------------------------------


def test_certificates_made_for_a_node_name_it(tmp_path: Path) -> None:
    ca_dir = str(tmp_path / "pki")
    make_ca(ca_dir)
    node = make_node_cert(ca_dir, "a-n0", nodes=[("a", "n0")])
    assert read_certificate(node.cert_file).nodes == ("dledger-node:a/n0",)
    assert read_certificate(make_node_cert(ca_dir, "namesrv").cert_file).nodes == ()
    before = _serial(node)
    again = make_node_cert(ca_dir, "a-n0", nodes=[("a", "n0")])  # a rotation: a new serial
    assert again == node and _serial(again) != before
    res = CliRunner().invoke(dledger_main, ["tls", "make-cert", ca_dir, "b/n2"])
    assert res.exit_code == 0, res.output
    assert read_certificate(os.path.join(ca_dir, "b-n2.pem")).nodes == ("dledger-node:b/n2",)
    bad = CliRunner().invoke(dledger_main, ["tls", "make-cert", ca_dir, "/n2"])
    assert bad.exit_code != 0 and "GROUP/ID" in bad.output
    up = UpTls.prepare(str(tmp_path / "up"))
    args = up.args("my-group-n1", peer_mtls=True)  # dledger up's name: GROUP-ID
    cert_file = args[args.index("--tls-cert") + 1]
    assert read_certificate(cert_file).nodes == ("dledger-node:my-group/n1",)
    ns_args = up.args("namesrv")
    assert read_certificate(ns_args[ns_args.index("--tls-cert") + 1]).nodes == ()


def test_read_certificate_names_a_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_bytes(b"not a certificate")
    with pytest.raises(TlsConfigError, match="cannot read the certificate"):
        read_certificate(str(bad))
    with pytest.raises(TlsConfigError, match="cannot read the certificate"):
        read_certificate(str(tmp_path / "missing.pem"))


# -- TlsConfig.reload on a serving listener ------------------------------------------------------


async def _server_serial(port: int, ctx: ssl.SSLContext) -> str:
    """Open a fresh TLS connection; the serial of the certificate the server presented."""
    _, writer = await asyncio.open_connection(HOST, port, ssl=ctx, server_hostname=HOST)
    try:
        cert = writer.get_extra_info("peercert")
        return str(cert["serialNumber"])
    finally:
        writer.close()


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(data)
        await writer.drain()
    writer.close()


def test_reload_applies_to_new_connections_of_a_serving_listener(tmp_path: Path) -> None:
    ca_dir = str(tmp_path / "pki")
    ca = make_ca(ca_dir)
    live = make_node_cert(ca_dir, "a-n0")
    first = _serial(live)
    tls = TlsConfig(live.cert_file, live.key_file, ca)

    async def main() -> None:
        server = await asyncio.start_server(_echo, HOST, 0, ssl=tls.server_context())
        port = server.sockets[0].getsockname()[1]
        try:
            dial = client_context(ca)
            assert await _server_serial(port, dial) == first
            old_reader, old_writer = await asyncio.open_connection(HOST, port, ssl=dial,
                                                                   server_hostname=HOST)
            _replace(make_node_cert(ca_dir, "a-n0", out_dir=str(tmp_path / "new")), live)
            second = _serial(live)
            assert second != first
            # Negative control: new files, no reload: new connections still get the old one.
            assert await _server_serial(port, dial) == first
            tls.reload()
            assert await _server_serial(port, dial) == second
            old_writer.write(b"still here")  # the connection made before the reload goes on
            assert await old_reader.readexactly(10) == b"still here"
            assert old_writer.get_extra_info("peercert")["serialNumber"] == first
            old_writer.close()
            # A key that does not fit its certificate: refused, the certificate in use stays.
            other = make_node_cert(ca_dir, "a-n1", out_dir=str(tmp_path / "other"))
            os.replace(other.key_file, live.key_file)
            with pytest.raises(TlsConfigError, match="cannot load the certificate"):
                tls.reload()
            assert await _server_serial(port, dial) == second
            (tmp_path / "pki" / "a-n0.pem").write_bytes(b"garbage")  # unreadable: the same
            with pytest.raises(TlsConfigError):
                tls.reload()
            assert await _server_serial(port, dial) == second
        finally:
            server.close()
            await server.wait_closed()

    _run(main())


def test_reload_to_a_new_ca_swaps_what_listeners_require_and_adds_to_dialers(
        tmp_path: Path) -> None:
    """--peer-mtls listener: after the CA file becomes a new CA, a client certificate of the old
    CA is refused and one of the new CA taken; the shared dial context trusts both."""
    old_dir, new_dir = str(tmp_path / "old"), str(tmp_path / "new")
    old_ca, new_ca = make_ca(old_dir), make_ca(new_dir)
    live = make_node_cert(old_dir, "a-n0", nodes=[("a", "n0")])
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(Path(old_ca).read_bytes())
    tls = TlsConfig(live.cert_file, live.key_file, str(ca_file), peer_mtls=True)
    old_peer = make_node_cert(old_dir, "a-n1", nodes=[("a", "n1")])
    new_peer = make_node_cert(new_dir, "a-n1", nodes=[("a", "n1")])
    dial = tls.dial_context()
    assert len(dial.get_ca_certs()) == 1

    async def accepted(cert: NodeCert, trust: str) -> bool:
        """Whether the peer listener takes a heartbeat from n1 presenting ``cert``."""
        inbox: list[RaftMessage] = []
        transport = PeerTransport("n0", "a", (HOST, 0), {}, inbox.append,
                                  rng=random.Random(1), server_ssl=tls.peer_server_context(),
                                  dial_ssl=tls.peer_client_context, peer_identity=True)
        _, port = await transport.start()
        try:
            return await _say_hello(port, client_context(trust, cert.cert_file, cert.key_file),
                                    "n1", inbox)
        finally:
            await transport.stop()

    async def main() -> None:
        assert await accepted(old_peer, old_ca)
        assert not await accepted(new_peer, old_ca)  # control: the new CA is not trusted yet
        _replace(make_node_cert(new_dir, "a-n0", nodes=[("a", "n0")],
                                out_dir=str(tmp_path / "stage")), live)
        ca_file.write_bytes(Path(new_ca).read_bytes())
        tls.reload()
        assert await accepted(new_peer, new_ca)
        assert not await accepted(old_peer, new_ca)  # the old CA is no longer taken
        assert len(dial.get_ca_certs()) == 2  # dialers: the new CA added, the old one kept

    _run(main())


# -- --peer-mtls: a certificate must name the node it claims to be --------------------------------


async def _say_hello(port: int, ctx: ssl.SSLContext, claim: str,
                     inbox: list[RaftMessage]) -> bool:
    """Dial the peer listener, say Hello as ``claim`` and send it a heartbeat: True once the
    heartbeat reached ``inbox`` (the listener's), False when the listener closed the
    connection instead (a peer link says nothing back: a read ends only by a close)."""
    before = len(inbox)
    reader, writer = await asyncio.open_connection(HOST, port, ssl=ctx, server_hostname=HOST)
    writer.write(encode_frame(encode_message(Hello("a", claim, f"{HOST}:1"))))
    writer.write(encode_frame(encode_message(Heartbeat(src=claim, dst="n0", term=1, commit=0))))
    closed = asyncio.ensure_future(reader.read())
    try:
        await wait_until(lambda: closed.done() or len(inbox) > before, 10, "delivery or a close")
        return len(inbox) > before
    finally:
        closed.cancel()
        try:
            await closed
        except (asyncio.CancelledError, OSError):  # (SSLError and resets are OSErrors)
            pass
        writer.close()


def test_the_peer_listener_refuses_a_certificate_naming_another_node(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ca_dir = str(tmp_path / "pki")
    ca = make_ca(ca_dir)
    n0 = make_node_cert(ca_dir, "a-n0", nodes=[("a", "n0")])
    n1 = make_node_cert(ca_dir, "a-n1", nodes=[("a", "n1")])
    n2 = make_node_cert(ca_dir, "a-n2", nodes=[("a", "n2")])
    tls = TlsConfig(n0.cert_file, n0.key_file, ca, peer_mtls=True)

    async def main(identity: bool) -> tuple[bool, bool, list[RaftMessage]]:
        inbox: list[RaftMessage] = []
        transport = PeerTransport("n0", "a", (HOST, 0), {}, inbox.append, rng=random.Random(1),
                                  server_ssl=tls.peer_server_context(),
                                  dial_ssl=tls.peer_client_context, peer_identity=identity)
        _, port = await transport.start()
        try:
            impostor = await _say_hello(port, client_context(ca, n2.cert_file, n2.key_file),
                                        "n1", inbox)
            honest = await _say_hello(port, client_context(ca, n1.cert_file, n1.key_file),
                                      "n1", inbox)
        finally:
            await transport.stop()
        return impostor, honest, inbox

    with caplog.at_level(logging.WARNING, logger="dledger.network.transport"):
        impostor, honest, inbox = _run(main(identity=True))
    assert not impostor and honest
    assert [m.src for m in inbox] == ["n1"]  # only the honest one's heartbeat
    refused = [r.getMessage() for r in caplog.records if "PeerIdentityError" in r.getMessage()]
    assert len(refused) == 1 and "it says it is 'n1'" in refused[0] \
        and "names dledger-node:a/n2, not dledger-node:a/n1" in refused[0], refused
    # Negative control: without the identity check (TLS with a CA only) the impostor is kept.
    impostor, honest, inbox = _run(main(identity=False))
    assert impostor and honest and len(inbox) == 2


def test_a_dialing_node_refuses_a_listener_naming_another_node(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ca_dir = str(tmp_path / "pki")
    ca = make_ca(ca_dir)
    certs = {n: make_node_cert(ca_dir, f"a-{n}", nodes=[("a", n)]) for n in ("n0", "n1", "n2")}

    def tls(cert: str) -> TlsConfig:
        return TlsConfig(certs[cert].cert_file, certs[cert].key_file, ca, peer_mtls=True)

    async def link_up(listener_cert: str) -> bool:
        """n1 dials "n0" at a listener presenting ``listener_cert``'s certificate."""
        inbox: list[RaftMessage] = []
        listener = PeerTransport("n0", "a", (HOST, 0), {}, inbox.append, rng=random.Random(1),
                                 server_ssl=tls(listener_cert).peer_server_context(),
                                 peer_identity=False)
        addr = await listener.start()
        dialer_tls = tls("n1")
        dialer = PeerTransport("n1", "a", (HOST, 0), {"n0": addr}, lambda m: None,
                               rng=random.Random(2), dial_ssl=dialer_tls.peer_client_context,
                               server_ssl=dialer_tls.peer_server_context(), peer_identity=True,
                               backoff_min_s=0.01, backoff_max_s=0.05)
        await dialer.start()
        try:
            dialer.send(Heartbeat(src="n1", dst="n0", term=1, commit=0))
            if listener_cert == "n0":
                await wait_until(lambda: len(inbox) == 1, 10, "the heartbeat over the link")
            else:
                await wait_until(lambda: dialer.stats()["n0"]["errors"] >= 2, 10,
                                 "refused twice")
            return bool(dialer.stats()["n0"]["connected"])
        finally:
            await dialer.stop()
            await listener.stop()

    with caplog.at_level(logging.WARNING, logger="dledger.network.transport"):
        assert not _run(link_up("n2"))
        assert _run(link_up("n0"))  # negative control: the right certificate links up
    refused = [r.getMessage() for r in caplog.records if "PeerIdentityError" in r.getMessage()]
    assert refused and all("refusing n0" in m and "names dledger-node:a/n2" in m for m in refused)


# -- what SIGHUP runs: checks, then logs ---------------------------------------------------------


def test_the_reloader_logs_each_outcome_and_keeps_the_old_files_on_a_refusal(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ca_dir = str(tmp_path / "pki")
    ca = make_ca(ca_dir)
    live = make_node_cert(ca_dir, "a-n0", nodes=[("a", "n0")])
    first = _serial(live)
    tls = TlsConfig(live.cert_file, live.key_file, ca, peer_mtls=True)
    reloader = TlsReloader(tls, ("a", "n0"))
    with caplog.at_level(logging.WARNING, logger="dledger.tls"):
        _replace(make_node_cert(ca_dir, "a-n0", nodes=[("a", "n0")],
                                out_dir=str(tmp_path / "s1")), live)
        second = _serial(live)
        assert reloader.reload()
        assert reloader.current is not None and reloader.current.serial == second
        _replace(make_node_cert(ca_dir, "a-n0", nodes=[("a", "n1")],
                                out_dir=str(tmp_path / "s2")), live)
        assert not reloader.reload()  # names n1: this node's peers would refuse it
        assert tls.peer_client_context() is not None and reloader.current.serial == second
        fits = make_node_cert(ca_dir, "a-n0", nodes=[("a", "n0")], out_dir=str(tmp_path / "s3"))
        os.replace(fits.cert_file, live.cert_file)  # names n0, but the key is s2's
        assert not reloader.reload()
    lines = [r.getMessage() for r in caplog.records]
    assert f"serial {second}" in lines[0] and "TLS reloaded" in lines[0] \
        and "names dledger-node:a/n0" in lines[0] and "expires" in lines[0]
    assert lines[1].startswith("TLS reload refused, PeerIdentityError") \
        and f"still serving subject 'CN=a-n0,O=dledger test CA', serial {second}" in lines[1]
    assert lines[2].startswith("TLS reload refused, TlsConfigError")
    assert reloader.reloads == 1 and reloader.refusals == 2 and first != second
    assert not any("PRIVATE KEY" in line for line in lines)


def test_a_node_started_with_a_certificate_for_another_node_is_warned(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ca_dir = str(tmp_path / "pki")
    ca = make_ca(ca_dir)
    wrong = make_node_cert(ca_dir, "a-n1", nodes=[("a", "n1")])
    tls = TlsConfig(wrong.cert_file, wrong.key_file, ca, peer_mtls=True)
    with caplog.at_level(logging.WARNING, logger="dledger.tls"):
        TlsReloader(tls, ("a", "n0"))
        TlsReloader(tls, ("a", "n1"))  # control: its own certificate, no warning
        TlsReloader(TlsConfig(wrong.cert_file, wrong.key_file, ca), ("a", "n0"))  # no mTLS
    assert [r.getMessage() for r in caplog.records if "does not name it" in r.getMessage()] \
        == [r.getMessage() for r in caplog.records]
    assert len(caplog.records) == 1
