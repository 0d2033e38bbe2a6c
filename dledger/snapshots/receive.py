"""The follower's side of a snapshot transfer: take a stream handed over by the peer transport
(``dledger.network.peer_stream``), stage its files (``dledger.snapshots.files``), verify them, and once the
whole snapshot is staged and fsynced step the node's Raft core with ``InstallSnapshot``.

Owns the receiver's half of the protocol in ``dledger.snapshots.wire``: one transfer at a time (a
new stream replaces the one running), none while a staged snapshot waits to be installed;
offers for another node or from an older term refused; every chunk's CRC checked as it comes
and every file's at the end. A stream that stalls past its deadline, or sends anything
malformed, is refused and closed; what it staged stays for the next offer to resume.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable

from dledger.network.peer_stream import PeerStream
from dledger.raft.types import InstallSnapshot
from dledger.snapshots.files import Staging
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
from protocol.errors import StorageError, WireError

__all__ = ["SnapshotReceiver"]

log = logging.getLogger("dledger.snapshot")


class SnapshotReceiver:
    def __init__(self, data_dir: str, node_id: str, current_term: Callable[[], int],
                 arrived: Callable[[InstallSnapshot], None], timeout_s: float = 10.0) -> None:
        self.data_dir = data_dir
        self.node_id = node_id
        self._current_term = current_term
        self._arrived = arrived
        self.timeout_s = timeout_s
        self._task: asyncio.Task[None] | None = None
        self._stream: PeerStream | None = None
        self.awaiting_install = False  # a staged snapshot was handed to the core
        self.received = 0  # snapshots staged
        self.refused = 0  # transfers refused or broken

    def accept(self, stream: PeerStream) -> None:
        """A new transfer: it replaces the one running (whose sender gave up, or is a stale
        leader: its stream is closed)."""
        if self._stream is not None:
            self._stream.close()
        if self._task is not None:
            self._task.cancel()
        self._stream = stream
        self._task = asyncio.get_running_loop().create_task(
            self._serve(stream), name=f"dledger-snapshot-recv-{self.node_id}")

    def settled(self) -> None:
        """The core took the staged snapshot (installed, or found it not needed)."""
        self.awaiting_install = False

    async def stop(self) -> None:
        if self._stream is not None:
            self._stream.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _serve(self, stream: PeerStream) -> None:
        try:
            offer = await self._offer(stream)
            staging = Staging(self.data_dir)
            held = await asyncio.to_thread(staging.begin, offer)
            stream.write(encode_snapshot_frame(Have(tuple(held))))
            await self._chunks(stream, staging)
        except (WireError, StorageError, OSError, TimeoutError) as err:
            self.refused += 1
            log.warning("%s: snapshot stream from %s refused: %s", self.node_id, stream.peer, err)
            stream.write(encode_snapshot_frame(Refuse(str(err) or type(err).__name__)))
            stream.close(flush=True)

    async def _offer(self, stream: PeerStream) -> Offer:
        frame = decode_snapshot_frame(await stream.get(self.timeout_s))
        if not isinstance(frame, Offer):
            raise WireError(f"expected an Offer, got {type(frame).__name__}")
        if frame.dst != self.node_id or frame.src != stream.peer:
            raise WireError(f"offer from {frame.src} to {frame.dst} on {stream.peer}'s stream")
        if frame.term < self._current_term():
            raise WireError(f"offer of term {frame.term} is stale (term {self._current_term()})")
        if self.awaiting_install:
            raise WireError("a staged snapshot is still to be installed")
        return frame

    async def _chunks(self, stream: PeerStream, staging: Staging) -> None:
        offer = staging.offer
        assert offer is not None
        while True:
            frame = decode_snapshot_frame(await stream.get(self.timeout_s))
            if isinstance(frame, Chunk):
                if zlib.crc32(frame.data) != frame.crc32:
                    raise WireError(f"chunk of file {frame.file_no} at {frame.offset}: bad CRC32")
                if frame.offset == 0 and 0 <= frame.file_no < len(staging.files) \
                        and staging.files[frame.file_no].held:
                    staging.restart_file(frame.file_no)  # the sender's bytes differ: anew
                staging.write(frame.file_no, frame.offset, frame.data)
            elif isinstance(frame, Done):
                await asyncio.to_thread(staging.finish, frame.digests)
                self.received += 1
                self.awaiting_install = True
                stream.write(encode_snapshot_frame(Staged()))
                stream.close(flush=True)
                self._arrived(InstallSnapshot(offer.term, offer.src, self.node_id, offer.meta))
                return
            else:
                raise WireError(f"unexpected {type(frame).__name__} in a snapshot stream")
