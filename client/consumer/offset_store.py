"""Local progress of a broadcasting push consumer, as RocketMQ's client keeps it (its
LocalFileOffsetStore): in broadcasting every member reads every queue, so progress belongs to the
member, not to the group on the broker. One JSON file per client id and consumer group under a
directory (default ``~/.dledger/offsets``): ``<dir>/<client_id>/<group>.json``.

This is the one place the library writes files (docs/design.md says it never does; this is
the documented exception, because RocketMQ's broadcasting semantics need it). The file is written
atomically (a temporary file, fsync, rename, fsync of the directory), so a crash leaves the old
or the new progress, never a torn one. A lock (``flock``) on ``<group>.json.lock`` keeps a second
consumer with the same client id, group and directory, in this process or another, from
interleaving its progress with ours: it gets ``OffsetStoreLockedError``. With ``slots`` above 1
(a consumer with the default id, ``client.identity``) a locked id makes the store try the next
spare id instead, ``<client_id>#2`` and so on; ``client_id`` and ``path`` are then the one taken.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from client.errors import OffsetStoreError, OffsetStoreLockedError
from client.identity import slot_ids
from client.types import MessageQueue

DEFAULT_DIR = os.path.join("~", ".dledger", "offsets")
VERSION = 1

Offsets = dict[MessageQueue, int]


def _safe(name: str) -> str:
    """A file-name-safe, reversible spelling of a client id or group name."""
    return quote(name, safe="@._-") or "%00"


class LocalOffsetStore:
    def __init__(self, directory: str | os.PathLike[str] | None, group: str, client_id: str,
                 slots: int = 1) -> None:
        self._base = Path(os.path.expanduser(os.fspath(directory if directory is not None
                                                       else DEFAULT_DIR)))
        self._ids = slot_ids(client_id, slots)
        self.group, self.client_id = group, client_id
        self.path = self._path(client_id)
        self.offsets: Offsets = {}  # the next offset to consume, per queue
        self._written: Offsets = {}  # what the file holds
        self._lock_fd: int | None = None

    def _path(self, client_id: str) -> Path:
        return self._base / _safe(client_id) / f"{_safe(self.group)}.json"

    def open(self) -> None:
        """Take the lock (of the first id free) and load the file (none yet: no progress).
        Blocking: call it in a thread."""
        for k, client_id in enumerate(self._ids):
            self.client_id, self.path = client_id, self._path(client_id)
            try:
                self._open()
                return
            except OffsetStoreLockedError:
                if k == len(self._ids) - 1:
                    raise

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise OffsetStoreError(f"cannot open the offset store {self.path}: {err}") from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            raise OffsetStoreLockedError(
                f"{self.path} is in use by another consumer of group {self.group!r} with client id "
                f"{self.client_id!r}: give each broadcasting consumer its own client_id") from err
        self._lock_fd = fd
        try:
            self.offsets = self._load()
        except BaseException:
            self.close()
            raise
        self._written = dict(self.offsets)

    def _load(self) -> Offsets:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as err:
            raise OffsetStoreError(f"cannot read {self.path}: {err}") from err
        try:
            doc = json.loads(text)
            if doc.get("version") != VERSION:
                raise ValueError(f"version {doc.get('version')!r}, this client reads {VERSION}")
            out: Offsets = {}
            for row in doc["offsets"]:
                mq = MessageQueue(_text(row["topic"]), _text(row["broker_group"]), _count(row["queue_id"]))
                out[mq] = _count(row["offset"])
            return out
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise OffsetStoreError(f"{self.path} is not a valid offset file ({err}): move it away "
                                   f"to start over (start_from applies then)") from err

    def get(self, mq: MessageQueue) -> int:
        """The stored next offset of ``mq``, -1 if none."""
        return self.offsets.get(mq, -1)

    def changed(self) -> Offsets | None:
        """A copy of the progress to write, or None when the file holds it already."""
        return None if self.offsets == self._written else dict(self.offsets)

    def write(self, offsets: Offsets) -> None:
        """Replace the file with ``offsets``, atomically. Blocking: call it in a thread."""
        doc: dict[str, Any] = {"version": VERSION, "group": self.group, "client_id": self.client_id,
                               "offsets": [{"topic": mq.topic, "broker_group": mq.group,
                                            "queue_id": mq.queue_id, "offset": off}
                                           for mq, off in sorted(offsets.items())]}
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as err:
            raise OffsetStoreError(f"cannot write {self.path}: {err}") from err
        self._written = offsets

    def close(self) -> None:
        """Release the lock (write first: ``changed`` and ``write``)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None


def _text(x: Any) -> str:
    if not isinstance(x, str):
        raise TypeError(f"expected a string, got {x!r}")
    return x


def _count(x: Any) -> int:
    if type(x) is not int or x < 0:
        raise ValueError(f"expected a non-negative integer, got {x!r}")
    return x
