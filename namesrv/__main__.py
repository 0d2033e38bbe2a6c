"""The NameServer's entry point (``python -m namesrv``; the ``dledger-namesrv`` command runs
``cli``): it decides whether the process loads OpenSSL (not without TLS: ``dledger.openssl``)
before it imports the command line and the server (``namesrv.cli``), then runs the command."""

from __future__ import annotations

import os
import sys

from dledger.openssl import unloaded_without_tls

__all__ = ["cli", "main"]


def main() -> None:
    """``python -m namesrv --listen ...``."""
    with unloaded_without_tls(sys.argv[1:], os.environ):
        from namesrv.cli import main as command
    command()


def cli() -> None:
    """``dledger-namesrv start --listen ...``."""
    with unloaded_without_tls(sys.argv[1:], os.environ):
        from namesrv.cli import cli as group
    group()


if __name__ == "__main__":
    main()
