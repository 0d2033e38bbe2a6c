"""The leader's side of a snapshot transfer: stream one snapshot's files to a follower over a
connection of its own to the follower's peer address (the address Raft traffic is dialed at,
so through the same proxies), in chunks, resuming where an earlier broken transfer left off.

Owns the sender's half of the protocol in ``dledger.snapshots.wire``. Memory is bounded by one
chunk in flight plus the socket's write buffer (``drain`` after every chunk). Every wait has a
deadline: a follower that stops reading or answering fails the transfer (``SnapshotSendError``),
and the node tells its Raft core, which retries at the pace of heartbeats.
"""

from __future__ import annotations

import asyncio
import logging
import os
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dledger.network.peer_identity import refusal
from dledger.network.wire import SnapshotHello, encode_message
from dledger.openssl import sha256
from dledger.raft.types import SnapshotMeta
from dledger.snapshots.wire import (
    Chunk,
    Done,
    Have,
    Offer,
    Refuse,
    Staged,
    decode_snapshot_frame,
    encode_snapshot_frame,
)
from protocol.errors import DLedgerError, WireError
from protocol.frames import FrameDecoder, encode_frame

if TYPE_CHECKING:
    import ssl

__all__ = ["SnapshotSendError", "SnapshotSource", "SourceFile", "send_snapshot"]

log = logging.getLogger("dledger.snapshot")

CHUNK_BYTES = 1 << 20


class SnapshotSendError(DLedgerError):
    """A snapshot transfer failed: refused by the follower, cut, or too slow."""


@dataclass
class SourceFile:
    name: str  # the snapshot's name for it (``log/...`` or ``app/...``)
    size: int
    fd: int | None = None  # an open file to read ``size`` bytes from (closed by the source)
    content: bytes = b""  # or the bytes themselves


@dataclass
class SnapshotSource:
    """One snapshot as the leader sends it: its meta and its files, opened when it was taken
    (so later checkpoints and retention do not change what is sent)."""

    meta: SnapshotMeta
    files: list[SourceFile] = field(default_factory=list)

    def read(self, file_no: int, offset: int, size: int) -> bytes:
        f = self.files[file_no]
        if f.fd is None:
            return f.content[offset : offset + size]
        data = os.pread(f.fd, size, offset)
        if len(data) != size:
            raise SnapshotSendError(f"{f.name} ended at {offset + len(data)} of {f.size} bytes")
        return data

    def hash_of(self, file_no: int, size: int) -> Any:
        """SHA-256 fed the first ``size`` bytes of a file (more may follow)."""
        digest, offset = sha256(), 0
        while offset < size:
            n = min(CHUNK_BYTES, size - offset)
            digest.update(self.read(file_no, offset, n))
            offset += n
        return digest

    def close(self) -> None:
        for f in self.files:
            if f.fd is not None:
                os.close(f.fd)
                f.fd = None


async def send_snapshot(addr: tuple[str, int], group: str, node_id: str, term: int, dst: str,
                        source: SnapshotSource, *, timeout_s: float = 10.0,
                        chunk_bytes: int = CHUNK_BYTES,
                        ssl_context: ssl.SSLContext | None = None,
                        peer_identity: bool = False) -> tuple[int, int]:
    """Stream ``source`` to ``dst`` at ``addr``; once the follower has staged it, return the
    bytes sent and those not sent again (the follower held them from a broken transfer).
    ``timeout_s`` bounds each wait (connect, every write, every answer). ``ssl_context``: TLS
    to the follower's peer listener (its host name checked); ``peer_identity`` (--peer-mtls):
    its certificate must name ``dst`` (``dledger.network.peer_identity``)."""
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection(
            *addr, ssl=ssl_context, server_hostname=addr[0] if ssl_context is not None else None)
    try:
        why = refusal(writer.transport, group, dst) if peer_identity else None
        if why is not None:
            raise SnapshotSendError(f"not sent to {dst} at {addr[0]}:{addr[1]}: {why}")
        offer = Offer(term, node_id, dst, source.meta,
                      tuple((f.name, f.size) for f in source.files))
        writer.write(encode_frame(encode_message(SnapshotHello(group, node_id))))
        writer.write(encode_snapshot_frame(offer))
        decoder = FrameDecoder()
        have = await _answer(reader, decoder, timeout_s)
        if not isinstance(have, Have) or len(have.held) != len(source.files):
            raise SnapshotSendError(f"expected Have for {len(source.files)} files, got {have}")
        sent, skipped, digests = 0, 0, []
        for file_no, (held, held_digest) in enumerate(have.held):
            offset, digest = 0, sha256()
            size = source.files[file_no].size
            if 0 < held <= size:
                mine = await asyncio.to_thread(source.hash_of, file_no, held)
                if mine.digest() == held_digest:  # resume after what the follower holds
                    offset, digest = held, mine
                    skipped += held
            while offset < size:
                n = min(chunk_bytes, size - offset)
                data = await asyncio.to_thread(source.read, file_no, offset, n)
                digest.update(data)
                writer.write(encode_snapshot_frame(Chunk(file_no, offset, data, zlib.crc32(data))))
                async with asyncio.timeout(timeout_s):
                    await writer.drain()
                offset += n
                sent += n
            digests.append(digest.digest())
        writer.write(encode_snapshot_frame(Done(tuple(digests))))
        answer = await _answer(reader, decoder, timeout_s)
        if not isinstance(answer, Staged):
            raise SnapshotSendError(f"follower {dst} did not stage the snapshot: {answer}")
        return sent, skipped
    except (OSError, WireError) as err:
        raise SnapshotSendError(f"snapshot to {dst}: {err}") from err
    finally:
        writer.close()


async def _answer(reader: asyncio.StreamReader, decoder: FrameDecoder,
                  timeout_s: float) -> object:
    """The follower's next frame (a Refuse raises)."""
    async with asyncio.timeout(timeout_s):
        while True:
            data = await reader.read(65536)
            if not data:
                raise SnapshotSendError("the follower closed the snapshot stream")
            frames = decoder.feed(data)
            if frames:
                frame = decode_snapshot_frame(frames[0])
                if isinstance(frame, Refuse):
                    raise SnapshotSendError(f"refused: {frame.reason}")
                return frame
