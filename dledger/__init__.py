"""dledger: a Raft-replicated (DLedger-style) message broker cluster: the replicated log (this
package), the broker, NameServer, client and chaos suite beside it.

``__version__`` is the one place the version is written: pyproject.toml reads it from here, and
a process's first log line says it without importing ``importlib.metadata`` (3.5 MiB of a
broker's start)."""

__version__ = "0.1.0"
