"""The broker's entry point (``python -m broker``, the ``dledger-broker`` command): it decides
whether the process loads OpenSSL (not without TLS: ``dledger.openssl``) before it imports the
command line and the server (``broker.cli``), then runs the command line."""

from __future__ import annotations

import os
import sys

from dledger.openssl import unloaded_without_tls

__all__ = ["main"]


def main() -> None:
    with unloaded_without_tls(sys.argv[1:], os.environ):
        from broker.cli import main as command_line
    command_line()


if __name__ == "__main__":
    main()
