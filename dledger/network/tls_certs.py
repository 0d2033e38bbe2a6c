"""A test certificate authority for ``dledger up --tls`` and ``dledger tls make-ca``: one CA key
and certificate, and per-node certificates it signs (server and client use, so the same file
serves a listener and a mutual-TLS peer dial), each with the subject alternative names that
host-name checking needs (127.0.0.1, ::1 and localhost by default, plus the node's host) and,
for a node of a group, the URI that names it to its peers under ``--peer-mtls``
(``dledger-node:GROUP/ID``, ``dledger.network.peer_identity``).

For tests and trials: the CA key is written next to its certificate, unencrypted (mode 0600).
A production cluster uses certificates from its own CA (docs/tls.md). Owns only file
generation; the ``cryptography`` package does the cryptography.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dledger.network.peer_identity import node_uri
from protocol.tls import ENV_CA

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "DEFAULT_HOSTS",
    "LoopbackClusterTls",
    "NodeCert",
    "loopback_tls_env",
    "make_ca",
    "make_loopback_cluster_tls",
    "make_node_cert",
]

CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"
DEFAULT_HOSTS = ("127.0.0.1", "::1", "localhost")
VALID_DAYS = 825  # what browsers accept for a leaf certificate; the CA gets twice this


@dataclass(frozen=True)
class NodeCert:
    cert_file: str
    key_file: str


def _write(path: str, data: bytes, private: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "dledger test CA"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _sans(hosts: Sequence[str], nodes: Sequence[tuple[str, str]] = ()) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for host in dict.fromkeys(h.strip("[]") for h in hosts if h):
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            out.append(x509.DNSName(host))
    out += [x509.UniformResourceIdentifier(node_uri(g, n)) for g, n in dict.fromkeys(nodes)]
    return out


def make_ca(directory: str, name: str = "dledger test CA") -> str:
    """Write a new CA (``ca.pem``, ``ca-key.pem``) into ``directory``; return the cert path.
    An existing CA there is kept (FileExistsError), so that its node certificates stay good."""
    os.makedirs(directory, exist_ok=True)
    cert_path, key_path = os.path.join(directory, CA_CERT), os.path.join(directory, CA_KEY)
    if os.path.exists(cert_path) or os.path.exists(key_path):
        raise FileExistsError(f"{directory} already holds a CA ({CA_CERT}, {CA_KEY})")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(_name(name)).issuer_name(_name(name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2 * VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    _write(key_path, _key_pem(key), private=True)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return cert_path


def make_node_cert(ca_dir: str, name: str, hosts: Sequence[str] = DEFAULT_HOSTS,
                   out_dir: str | None = None,
                   nodes: Sequence[tuple[str, str]] = ()) -> NodeCert:
    """Sign a certificate for ``name`` (its common name and file name: ``a-n0``, ``namesrv``)
    valid for ``hosts`` with the CA in ``ca_dir``, naming the nodes ``nodes`` (group, node id)
    to their peers; write ``NAME.pem`` and ``NAME-key.pem`` into ``out_dir`` (default ca_dir),
    replacing any there (a new serial: what a rotation writes)."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"certificate name {name!r} is not a plain file name")
    if not hosts:
        raise ValueError("a node certificate needs at least one host")
    with open(os.path.join(ca_dir, CA_KEY), "rb") as f:
        ca_key = serialization.load_pem_private_key(f.read(), password=None)
    with open(os.path.join(ca_dir, CA_CERT), "rb") as f:
        ca_cert = x509.load_pem_x509_certificate(f.read())
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca_dir}/{CA_KEY} is not a key this helper made")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(_name(name)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(_sans(hosts, nodes)), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    out = out_dir or ca_dir
    os.makedirs(out, exist_ok=True)
    node = NodeCert(os.path.join(out, f"{name}.pem"), os.path.join(out, f"{name}-key.pem"))
    _write(node.key_file, _key_pem(key), private=True)
    _write(node.cert_file, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return node


@dataclass(frozen=True)
class LoopbackClusterTls:
    """A test CA and one certificate shared by every process of a cluster on this machine
    (the chaos runner, the benchmark): the command-line options of each kind of process."""

    ca_file: str
    namesrv_args: tuple[str, ...]
    broker_args: tuple[str, ...]


def make_loopback_cluster_tls(directory: str, group: str, node_ids: Sequence[str],
                              peer_mtls: bool = True) -> LoopbackClusterTls:
    """A new CA in ``directory`` and one certificate for 127.0.0.1/localhost that names every
    node of ``node_ids`` in ``group`` (every process shares it, so under ``--peer-mtls`` each
    may claim any of them: a test's cluster on one machine, never a real one); brokers get
    ``--peer-mtls`` when ``peer_mtls``."""
    ca = make_ca(directory)
    cert = make_node_cert(directory, "loopback", nodes=[(group, n) for n in node_ids])
    args = ("--tls-cert", cert.cert_file, "--tls-key", cert.key_file, "--tls-ca", ca)
    return LoopbackClusterTls(ca, args, (*args, *(("--peer-mtls",) if peer_mtls else ())))


@contextlib.contextmanager
def loopback_tls_env(directory: str, group: str,
                     node_ids: Sequence[str]) -> Iterator[LoopbackClusterTls]:
    """``make_loopback_cluster_tls``, with DLEDGER_TLS_CA naming its CA in this process (so the
    client library speaks TLS to the cluster) until the block ends."""
    files = make_loopback_cluster_tls(directory, group, node_ids)
    before = os.environ.get(ENV_CA)
    os.environ[ENV_CA] = files.ca_file
    try:
        yield files
    finally:
        if before is None:
            os.environ.pop(ENV_CA, None)
        else:
            os.environ[ENV_CA] = before
