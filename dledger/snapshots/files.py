"""A snapshot's files on a follower's disk: staged while they stream in, then installed in place of
the node's log and its state machine's files, crash-safe at every step.

Layout under the node's data directory:
- ``snapshot.staging/``: the transfer in progress or the last broken one: ``offer`` (what is
  coming, CBOR), the files under their snapshot names (``log/...``, ``app/...``), and once all
  of them are in, verified and fsynced, ``complete`` (which snapshot they make up). A new offer
  keeps the files it names again (their bytes are resumed, see ``dledger.snapshots.wire``) and
  deletes the rest.
- ``snapshot.install/``: the staging directory renamed, the one step that commits an install. From
  there ``finish_install`` moves ``log/`` over the node's log directory and each ``app/`` entry
  over the same name in the data directory, deletes the app's derived data it names, and
  removes the directory. It is idempotent: run again after a crash at any step (a node runs it
  before opening anything) it ends the same.

Owns only files; what the files mean is the log store's and the application's business. Plain
blocking I/O: the callers run the long parts (reading back, fsync) in a thread.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cbor2

from dledger.openssl import sha256
from dledger.raft.types import Membership, SnapshotMeta
from dledger.snapshots.wire import Offer, valid_file_name
from dledger.storage.hardstate import fsync_directory, write_file_atomically
from protocol.errors import StorageError

__all__ = ["INSTALL_DIR", "STAGING_DIR", "Staging", "commit_install", "finish_install"]

STAGING_DIR = "snapshot.staging"
INSTALL_DIR = "snapshot.install"
_OFFER = "offer"
_COMPLETE = "complete"
_READ_BYTES = 1 << 20


def _hash_of(path: str, size: int) -> Any:
    """A SHA-256 object fed the first ``size`` bytes of the file (more may follow)."""
    digest = sha256()
    with open(path, "rb") as f:
        left = size
        while left > 0:
            buf = f.read(min(_READ_BYTES, left))
            if not buf:
                raise StorageError(f"{path} is shorter than {size} bytes")
            digest.update(buf)
            left -= len(buf)
    return digest


@dataclass
class _File:
    name: str
    size: int  # as offered
    held: int  # bytes written so far, from the start
    hash: Any  # SHA-256 of those bytes, fed as chunks come


class Staging:
    """One transfer into ``<data dir>/snapshot.staging``."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.dir = os.path.join(data_dir, STAGING_DIR)
        self.offer: Offer | None = None
        self.files: list[_File] = []

    def begin(self, offer: Offer) -> list[tuple[int, bytes]]:
        """Take a new offer: keep the bytes held of the files it names again (cut to their
        offered size), delete everything else. Returns (bytes held, their SHA-256) per file."""
        for name, _ in offer.files:
            if not valid_file_name(name):
                raise StorageError(f"snapshot file name {name!r} refused")
        os.makedirs(self.dir, exist_ok=True)
        offered = {name: size for name, size in offer.files}
        for root, _, names in os.walk(self.dir, topdown=False):
            for name in names:
                path = os.path.join(root, name)
                rel = os.path.relpath(path, self.dir)
                if rel not in offered:
                    os.unlink(path)
        write_file_atomically(os.path.join(self.dir, _OFFER), cbor2.dumps(
            [offer.meta.index, offer.meta.term, offer.meta.membership.encode(),
             [list(f) for f in offer.files]]))
        self.files = []
        for name, size in offer.files:
            path = os.path.join(self.dir, name)
            held = os.path.getsize(path) if os.path.exists(path) else 0
            if held > size:
                os.truncate(path, size)
                held = size
            self.files.append(_File(name, size, held,
                                    _hash_of(path, held) if held else sha256()))
        self.offer = offer
        return [(f.held, f.hash.digest()) for f in self.files]

    def restart_file(self, file_no: int) -> None:
        """The sender's bytes differ from those held: the file starts over."""
        f = self.files[file_no]
        path = os.path.join(self.dir, f.name)
        if os.path.exists(path):
            os.truncate(path, 0)
        f.held, f.hash = 0, sha256()

    def write(self, file_no: int, offset: int, data: bytes) -> None:
        """Append ``data`` to a file at ``offset``, which must be where it ends now."""
        if not 0 <= file_no < len(self.files):
            raise StorageError(f"snapshot chunk for file {file_no} of {len(self.files)}")
        f = self.files[file_no]
        if offset != f.held or offset + len(data) > f.size:
            raise StorageError(f"snapshot chunk at {offset}+{len(data)} of {f.name}: "
                               f"{f.held} of {f.size} bytes held")
        path = os.path.join(self.dir, f.name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            written = os.pwrite(fd, data, offset)
        finally:
            os.close(fd)
        if written != len(data):
            raise StorageError(f"short write to {path}")
        f.held += len(data)
        f.hash.update(data)

    def finish(self, digests: Sequence[bytes]) -> None:
        """Every file whole and as the sender read it: fsync them and mark the staging
        complete. StorageError if anything differs (the transfer is refused, not installed)."""
        if self.offer is None or len(digests) != len(self.files):
            raise StorageError("snapshot done before its offer, or for other files")
        for f, digest in zip(self.files, digests):
            if f.held != f.size or f.hash.digest() != digest:
                raise StorageError(f"snapshot file {f.name}: {f.held} of {f.size} bytes, SHA-256 "
                                   f"{f.hash.hexdigest()[:16]} against the sender's "
                                   f"{digest.hex()[:16]}")
            path = os.path.join(self.dir, f.name)
            if not os.path.exists(path):  # (an empty file: no chunk created it)
                open(path, "wb").close()
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for root, dirs, _ in os.walk(self.dir):
            for d in dirs:
                fsync_directory(os.path.join(root, d))
        meta = self.offer.meta
        write_file_atomically(os.path.join(self.dir, _COMPLETE),
                              cbor2.dumps([meta.index, meta.term, meta.membership.encode()]))


def staged_meta(data_dir: str) -> SnapshotMeta | None:
    """The snapshot a complete staging directory holds, or None."""
    try:
        with open(os.path.join(data_dir, STAGING_DIR, _COMPLETE), "rb") as f:
            index, term, membership = cbor2.loads(f.read())
        return SnapshotMeta(index, term, Membership.decode(membership))
    except (OSError, ValueError, TypeError, cbor2.CBORDecodeError):
        return None


def commit_install(data_dir: str, meta: SnapshotMeta) -> None:
    """Commit to installing the staged snapshot ``meta`` (one rename); ``finish_install`` next."""
    staged = staged_meta(data_dir)
    if staged is None or (staged.index, staged.term) != (meta.index, meta.term):
        raise StorageError(f"no complete staged snapshot {meta.index} (term {meta.term}) to "
                           f"install (staged: {staged})")
    os.rename(os.path.join(data_dir, STAGING_DIR), os.path.join(data_dir, INSTALL_DIR))
    fsync_directory(data_dir)


def finish_install(data_dir: str, log_dir_name: str = "log",
                   derived: Sequence[str] = ()) -> bool:
    """Finish an install ``commit_install`` began (see the module docstring); the caller has
    closed its log store and application files. ``derived``: data-dir entries the application
    rebuilds (deleted). Returns whether there was one to finish."""
    inst = os.path.join(data_dir, INSTALL_DIR)
    if not os.path.isdir(inst):
        return False
    new_log = os.path.join(inst, "log")
    if os.path.isdir(new_log):
        _replace(new_log, os.path.join(data_dir, log_dir_name))
    app = os.path.join(inst, "app")
    if os.path.isdir(app):
        for name in sorted(os.listdir(app)):
            _replace(os.path.join(app, name), os.path.join(data_dir, name))
    for name in derived:
        _remove(os.path.join(data_dir, name))
    fsync_directory(data_dir)
    shutil.rmtree(inst)
    fsync_directory(data_dir)
    return True


def _replace(src: str, dst: str) -> None:
    _remove(dst)
    os.rename(src, dst)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
