"""``dledger tls make-ca DIR`` and ``dledger tls make-cert DIR NAME``: a test CA and the
certificates it signs (``dledger.network.tls_certs``); and ``UpTls``, the CA and certificates that
``dledger up --tls`` makes under its data directory and the options each process gets.

Owns the commands and the file layout of ``up --tls``; the certificates themselves are
``dledger.network.tls_certs``'s. Test CAs only: a production cluster brings its own (docs/tls.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import click

from dledger.network.tls_certs import CA_CERT, DEFAULT_HOSTS, NodeCert, make_ca, make_node_cert

UP_TLS_DIR = "tls"  # under dledger up's --data-dir


@click.group()
def tls() -> None:
    """A test certificate authority for a TLS cluster (docs/tls.md)."""


@tls.command("make-ca")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--node", "nodes", multiple=True,
              help="Also sign a certificate for this name (repeatable): NAME.pem, NAME-key.pem; "
                   "GROUP/ID: node ID of GROUP, named so to its peers (GROUP-ID.pem).")
@click.option("--host", "hosts", multiple=True,
              help=f"Host names and addresses the certificates are valid for (repeatable; "
                   f"default {', '.join(DEFAULT_HOSTS)}).")
def make_ca_command(directory: str, nodes: tuple[str, ...], hosts: tuple[str, ...]) -> None:
    """Make a new CA in DIRECTORY (ca.pem, ca-key.pem), and certificates for --node names."""
    try:
        ca = make_ca(directory)
    except FileExistsError as err:
        raise click.ClickException(str(err)) from err
    click.echo(f"CA: {ca}  (key {os.path.join(directory, 'ca-key.pem')}, keep it private)")
    for name in nodes:
        _sign(directory, name, hosts)
    click.echo(f"clients: export DLEDGER_TLS_CA={os.path.abspath(ca)}")


@tls.command("make-cert")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.argument("name", metavar="NAME|GROUP/ID")
@click.option("--host", "hosts", multiple=True,
              help=f"Host names and addresses the certificate is valid for (repeatable; "
                   f"default {', '.join(DEFAULT_HOSTS)}).")
def make_cert_command(directory: str, name: str, hosts: tuple[str, ...]) -> None:
    """Sign a certificate for NAME with the CA in DIRECTORY (NAME.pem, NAME-key.pem); GROUP/ID
    signs node ID of GROUP's (GROUP-ID.pem), which names it to its peers (--peer-mtls). Run again
    for a new certificate (a new serial) to rotate: the files are replaced."""
    _sign(directory, name, hosts)


def node_of(name: str) -> tuple[str, tuple[str, str] | None]:
    """A certificate's file name, and the node it names: ``a/n0`` is node n0 of group a
    (``a-n0.pem``); a name without '/' (``namesrv``) names no node."""
    group, slash, node_id = name.partition("/")
    if not slash:
        return name, None
    if not group or not node_id:
        raise click.BadParameter(f"{name!r}: a node is named GROUP/ID")
    return f"{group}-{node_id}", (group, node_id)


def _sign(directory: str, name: str, hosts: tuple[str, ...]) -> NodeCert:
    file_name, node = node_of(name)
    try:
        cert = make_node_cert(directory, file_name, hosts or DEFAULT_HOSTS,
                              nodes=[node] if node else ())
    except (OSError, ValueError) as err:
        raise click.ClickException(f"cannot sign a certificate for {name!r}: {err}") from err
    click.echo(f"{name}: {cert.cert_file}  key {cert.key_file}")
    return cert


@dataclass(frozen=True)
class UpTls:
    """``dledger up --tls``'s files: one CA under DATA_DIR/tls (kept across runs, so clients
    keep trusting it) and a certificate per process (made anew at each start)."""

    directory: str

    @classmethod
    def prepare(cls, data_dir: str) -> UpTls:
        directory = os.path.join(data_dir, UP_TLS_DIR)
        if not os.path.exists(os.path.join(directory, CA_CERT)):
            make_ca(directory)
        return cls(directory)

    @property
    def ca_file(self) -> str:
        return os.path.join(self.directory, CA_CERT)

    def args(self, name: str, peer_mtls: bool = False) -> tuple[str, ...]:
        """The TLS options of process ``name`` (a NameServer, ``a-n0``), its certificate made.
        With ``peer_mtls`` it is a broker named GROUP-ID (as ``dledger up`` names them), and its
        certificate names that node to its peers."""
        group, _, node_id = name.rpartition("-")
        if peer_mtls and not (group and node_id):
            raise ValueError(f"a node's certificate is named GROUP-ID, not {name!r}")
        cert = make_node_cert(self.directory, name,
                              nodes=[(group, node_id)] if peer_mtls else ())
        return ("--tls-cert", cert.cert_file, "--tls-key", cert.key_file,
                "--tls-ca", self.ca_file, *(("--peer-mtls",) if peer_mtls else ()))
