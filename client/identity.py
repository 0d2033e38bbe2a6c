"""Client ids: every producer and consumer of the library names itself ``<host>@<instance>``
(RocketMQ's ``clientIP@instanceName``), and that id is what the brokers, ``dledger consumer
status``, ``dledger producer list`` and the message trace show, in one format.

- ``new_client_id()``, the default: ``<host>@<pid>#<8 hex>``: the process id, as RocketMQ's
  default instance name (``changeInstanceNameToPID``), and a random part, so that two clients
  of one process, or of two hosts with one name, never share an id.
- A broadcasting push consumer keeps its progress in a local file named by its id, so its
  default must survive a restart: ``<host>@DEFAULT`` (``broadcasting_client_id``), RocketMQ's
  too; while that file is locked by a running consumer of the same group (in this process or
  another), the next free of ``<host>@DEFAULT#2`` ... ``#BROADCASTING_SLOTS`` is taken
  (``client.consumer.offset_store``), so two such consumers on one host both start.
"""

from __future__ import annotations

import os
import secrets
import socket

HOST_MAX_CHARS = 200  # a broker takes client ids of at most 255 characters
DEFAULT_INSTANCE = "DEFAULT"
BROADCASTING_SLOTS = 64  # broadcasting consumers of one group, one host, default ids


def host() -> str:
    return socket.gethostname()[:HOST_MAX_CHARS] or "localhost"


def new_client_id() -> str:
    """``<host>@<pid>#<8 random hex>``."""
    return f"{host()}@{os.getpid()}#{secrets.token_hex(4)}"


def broadcasting_client_id() -> str:
    """``<host>@DEFAULT``: stable across restarts (a broadcasting consumer's progress file)."""
    return f"{host()}@{DEFAULT_INSTANCE}"


def slot_ids(client_id: str, slots: int) -> list[str]:
    """``client_id`` and its spares ``<client_id>#2`` ... ``#slots``, in the order to try."""
    return [client_id, *(f"{client_id}#{n}" for n in range(2, slots + 1))]


__all__ = ["BROADCASTING_SLOTS", "broadcasting_client_id", "host", "new_client_id", "slot_ids"]
