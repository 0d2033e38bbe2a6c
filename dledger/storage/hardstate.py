"""The file-backed hard-state store (``FileHardStateStore``) and the atomic small-file write.

Owns one small file holding a node's term and vote, replaced atomically on every save (temp
file, write, fsync, rename over it, fsync the directory), and the two durable file-system steps
the commitlog shares with it: that atomic write (for its retention meta file) and creating a
directory durably. A damaged file raises ``CorruptLogError``; it is
never read as an empty state, since forgetting a vote can elect two leaders in one term.

File layout: ``b"DLHS" | body length u32 | crc32(body) u32 | body`` where the body is UTF-8 JSON
``{"term": int, "voted_for": str | null}``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import struct
import zlib
from array import array
from collections.abc import Iterable
from typing import Any

from dledger.raft.types import HardState
from protocol.errors import CorruptLogError, DiskFullError, StorageError

_MAGIC = b"DLHS"
_HEADER = struct.Struct("<4sII")
TEMP_SUFFIX = ".tmp"


def fsync_directory(dir_path: str) -> None:
    """Make the directory's entries (created, renamed, deleted files) durable."""
    fd = os.open(dir_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomically(path: str,
                          data: bytes | Iterable[bytes | bytearray | array[Any]]) -> None:
    """Replace ``path`` by ``data`` (bytes, or chunks of them written one after another) so that a
    crash leaves either the old or the new content.

    Raises OSError; callers name the failure. A temp file left by a crash is never read.
    """
    temp_path = path + TEMP_SUFFIX
    try:
        fd = os.open(temp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for chunk in (data,) if isinstance(data, bytes) else data:
                view = memoryview(chunk).cast("B")  # (an array chunk: its bytes)
                while view:
                    view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_path)  # gives back the space a full disk needs
        raise
    os.replace(temp_path, path)
    fsync_directory(os.path.dirname(os.path.abspath(path)))


def make_dirs_durably(dir_path: str) -> None:
    """Create ``dir_path`` and missing parents, fsyncing each new entry's parent directory:
    otherwise a power loss can lose a new directory along with the synced files in it."""
    missing = []
    while not os.path.isdir(dir_path):
        missing.append(dir_path)
        dir_path = os.path.dirname(dir_path)
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
        fsync_directory(os.path.dirname(path))


def storage_error(err: OSError, what: str) -> StorageError:
    """The named error for an OSError: DiskFullError on ENOSPC, StorageError otherwise."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(f"{what}: no space left on device")
    return StorageError(f"{what}: {err}")


def encode_hard_state(state: HardState) -> bytes:
    body = json.dumps({"term": state.term, "voted_for": state.voted_for}, sort_keys=True).encode()
    return _HEADER.pack(_MAGIC, len(body), zlib.crc32(body)) + body


def decode_hard_state(buf: bytes) -> HardState:
    """Raises ValueError when the bytes are not a whole, intact hard-state record."""
    if len(buf) < _HEADER.size:
        raise ValueError(f"{len(buf)} bytes, shorter than the header")
    magic, length, crc = _HEADER.unpack_from(buf)
    body = buf[_HEADER.size :]
    if magic != _MAGIC or length != len(body) or zlib.crc32(body) != crc:
        raise ValueError("bad magic, length or checksum")
    fields = json.loads(body)
    if not isinstance(fields, dict):
        raise ValueError(f"body is not an object: {fields!r}")
    term, voted_for = fields.get("term"), fields.get("voted_for")
    if type(term) is not int or term < 0 or not (voted_for is None or isinstance(voted_for, str)):
        raise ValueError(f"bad field types: {fields!r}")
    return HardState(term=term, voted_for=voted_for)


class FileHardStateStore:
    """A ``HardStateStore`` in one file; ``save`` returns once the new state is durable."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    def load(self) -> HardState:
        try:
            with open(self.path, "rb") as f:
                buf = f.read()
        except FileNotFoundError:
            return HardState()
        except OSError as err:
            raise storage_error(err, f"reading {self.path}") from err
        try:
            return decode_hard_state(buf)
        except ValueError as err:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise CorruptLogError(f"{self.path}: hard state is damaged: {err}") from err

    def save(self, state: HardState) -> None:
        try:
            write_file_atomically(self.path, encode_hard_state(state))
        except OSError as err:
            raise storage_error(err, f"saving {self.path}") from err
