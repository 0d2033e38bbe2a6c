"""Snapshots in a node (``SnapshotShell``, a part of ``dledger.node.runtime.Node``): the shell around the
core's snapshot messages (Raft section 7, ``dledger.raft.snapshots``).

A node has snapshots once its application gives it a ``SnapshotProvider`` (the broker does): the
application tells the node whenever it has made its state durable at an applied index
(``snapshot_taken``), and the node's snapshot is then that state plus the log up to there. So a
follower that receives one holds the same log (every retained message) and state as the leader.
This module owns: telling the core of snapshots; streaming one to a follower when the core sends
``InstallSnapshot`` (``dledger.snapshots.send``; one transfer per follower at a time, the outcome
reported to the core); taking transfers in (``dledger.snapshots.receive``) and stepping the core
when one is staged; and installing a snapshot when a Ready hands it out: the install is
committed by one rename, the log store closed, replaced and reopened, the application told to
reload (``dledger.snapshots.files``; a crash at any point is finished at the next start).
It must not interpret the application's files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

import cbor2

from dledger.network.peer_stream import PeerStream
from dledger.node.base import NodeBase
from dledger.raft.types import InstallSnapshot, Membership, SnapshotMeta
from dledger.snapshots.files import commit_install, finish_install
from dledger.snapshots.provider import SnapshotProvider
from dledger.snapshots.receive import SnapshotReceiver
from dledger.snapshots.send import SnapshotSendError, SnapshotSource, SourceFile, send_snapshot
from dledger.storage.commitlog import FileLogStore
from dledger.storage.hardstate import write_file_atomically
from protocol.errors import DLedgerError, StorageError

__all__ = ["SnapshotProvider", "SnapshotShell"]

log = logging.getLogger("dledger.snapshot")

MEMBERSHIP_FILE = "membership"  # the membership as of the latest snapshot (CBOR [index, bytes])


class SnapshotShell(NodeBase):
    """Snapshot transfers and installs (a part of ``dledger.node.runtime.Node``)."""

    def set_snapshot_provider(self, provider: SnapshotProvider) -> None:
        """Before ``start``: the application's snapshots (without one the node has none)."""
        self._snapshot_provider = provider

    def snapshot_taken(self, index: int) -> None:
        """The application made its state durable at applied index ``index``: the core may
        send it as a snapshot, and retention may delete the entries it covers."""
        def op() -> None:
            core, store = self._core(), self._store()
            if index < store.first_index() - 1 or index > store.last_index():
                return  # (not this log's: an install replaced it meanwhile)
            meta = SnapshotMeta(index, store.term_at(index), core.membership_at(index))
            self._save_membership(meta)  # (first: retention may cut the log to it next)
            core.snapshot_taken(meta)
            self._snapshot_meta = core.snapshot
        with contextlib.suppress(DLedgerError):  # stopped or frozen: the next one will do
            self._in_loop(op)

    def _initial_snapshot(self, applied_index: int) -> SnapshotMeta | None:
        """The snapshot a (re)built core starts with: the application's state it starts from."""
        if self._snapshot_provider is None or applied_index == 0:
            return None
        store = self._store()
        if not store.first_index() - 1 <= applied_index <= store.last_index():
            return None
        return SnapshotMeta(applied_index, store.term_at(applied_index),
                            self._core().membership_at(applied_index))

    def _saved_membership(self) -> tuple[int, Membership] | None:
        """The membership saved with the latest snapshot (None: none saved, or unreadable)."""
        if self._snapshot_provider is None:
            return None
        try:
            with open(os.path.join(self.config.data_dir, MEMBERSHIP_FILE), "rb") as f:
                index, data = cbor2.loads(f.read())
            return int(index), Membership.decode(data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, cbor2.CBORDecodeError) as err:
            log.warning("%s: ignoring %s: %s", self.config.node_id, MEMBERSHIP_FILE, err)
            return None

    def _save_membership(self, meta: SnapshotMeta) -> None:
        """Save a snapshot's membership: a restart reads the log's changes after it."""
        write_file_atomically(os.path.join(self.config.data_dir, MEMBERSHIP_FILE),
                              cbor2.dumps([meta.index, meta.membership.encode()]))

    def _snapshot_receiver(self) -> SnapshotReceiver:
        if self._receiver is None:
            self._receiver = SnapshotReceiver(
                self.config.data_dir, self.config.node_id, lambda: self._core().term,
                self._snapshot_arrived, self.config.snapshot_timeout_s)
        return self._receiver

    def _on_snapshot_stream(self, stream: PeerStream) -> None:
        if self._stopping or self._snapshot_provider is None:
            stream.close()
            return
        self._snapshot_receiver().accept(stream)

    # -- sending ---------------------------------------------------------------------------------

    def _start_snapshot_send(self, m: InstallSnapshot) -> None:
        """The core sends ``m``: stream the latest snapshot to its follower (once at a time)."""
        if m.dst in self._snapshot_sends or self._stopping:
            return
        self._snapshot_sends[m.dst] = asyncio.get_running_loop().create_task(
            self._send_snapshot(m), name=f"dledger-snapshot-send-{self.config.node_id}->{m.dst}")

    async def _send_snapshot(self, m: InstallSnapshot) -> None:
        ok, source = False, None
        try:
            source = self._snapshot_source()
            addr = self.config.dial.get(m.dst, self.config.peers.get(m.dst))
            if addr is None:
                raise SnapshotSendError(f"no address for {m.dst}")
            sent, skipped = await send_snapshot(
                addr, self.config.group, self.config.node_id, m.term, m.dst, source,
                timeout_s=self.config.snapshot_timeout_s,
                ssl_context=self.config.tls.peer_client_context() if self.config.tls else None,
                peer_identity=self.config.tls is not None and self.config.tls.peer_mtls)
            ok = True
            self.snapshots_sent += 1
            self.snapshot_resumed_bytes += skipped
            log.info("%s: snapshot %d (term %d) sent to %s: %d bytes (%d it held already)",
                     self.config.node_id, source.meta.index, source.meta.term, m.dst, sent,
                     skipped)
        except (DLedgerError, OSError, TimeoutError, IndexError) as err:
            self.snapshot_send_failures += 1
            log.warning("%s: snapshot to %s failed: %s", self.config.node_id, m.dst,
                        err or type(err).__name__)
        finally:
            if source is not None:
                source.close()
            self._snapshot_sends.pop(m.dst, None)
            with contextlib.suppress(DLedgerError):
                self._in_loop(lambda: self._core().report_snapshot(m.dst, ok))

    def _snapshot_source(self) -> SnapshotSource:
        """The latest snapshot, its files opened now (on the loop: no retention in between)."""
        provider = self._snapshot_provider
        got = provider.snapshot_source() if provider is not None else None
        if got is None:
            raise SnapshotSendError("the application has no durable state to send yet")
        index, app_files = got
        store = self._store()
        if not isinstance(store, FileLogStore):  # (refused at start: dledger.node.seams)
            raise SnapshotSendError(f"a {type(store).__name__} has no files to send")
        source = SnapshotSource(SnapshotMeta(index, store.term_at(index),
                                             self._core().membership_at(index)))
        try:
            for name, fd in app_files:
                source.files.append(SourceFile(f"app/{name}", os.fstat(fd).st_size, fd=fd))
            meta_record, segments = store.snapshot_files(index)
            source.files.append(SourceFile("log/meta", len(meta_record), content=meta_record))
            for name, path, size in segments:
                source.files.append(SourceFile(f"log/{name}", size, fd=os.open(path, os.O_RDONLY)))
        except BaseException:
            source.close()
            raise
        return source

    # -- receiving and installing ----------------------------------------------------------------

    def _snapshot_arrived(self, m: InstallSnapshot) -> None:
        """A whole snapshot is staged: the core decides whether to restore it."""
        receiver = self._snapshot_receiver()

        def op() -> None:
            core = self._core()
            core.step(m)
            if core.log.pending_snapshot is None:
                receiver.settled()  # not needed after all (already past it)
        try:
            self._in_loop(op)
        except DLedgerError:
            receiver.settled()

    async def _install_snapshot(self, meta: SnapshotMeta) -> None:
        """Install the staged snapshot the core restored (in the loop task, between a Ready
        and its advance): replace the log and the application's files, reopen, reload."""
        cfg = self.config
        provider = self._snapshot_provider
        if self._given_log is not None:  # (refused at start: dledger.node.seams)
            raise StorageError("a snapshot is installed by replacing the node's own log files")
        if provider is not None:
            await provider.snapshot_installing()
        if self.flusher is not None:
            await self.flusher.close()  # (nothing may fsync a store being replaced)
            self.flusher = None
        self._store().close()
        try:
            self._maybe_crash("staged")
            commit_install(cfg.data_dir, meta)
            self._maybe_crash("commit")
            finish_install(cfg.data_dir, "log", provider.snapshot_derived() if provider else ())
            store = self._open_log()  # (the node's own: dledger.node.seams)
        except OSError as err:
            raise StorageError(f"installing snapshot {meta.index}: {err}") from err
        if store.last_index() < meta.index or store.term_at(meta.index) != meta.term:
            raise StorageError(f"the installed log ends at {store.last_index()}, not at the "
                               f"snapshot's {meta.index} (term {meta.term})")
        self.store = store
        self._core().log.stable = store
        self.flusher = self._open_flusher(store)
        self._save_membership(meta)
        self._snapshot_meta = meta
        self.snapshots_installed += 1
        log.info("%s: installed snapshot %d (term %d); log %d..%d", cfg.node_id, meta.index,
                 meta.term, store.first_index(), store.last_index())
        if provider is not None:
            provider.snapshot_installed(meta)
        if self._receiver is not None:
            self._receiver.settled()

    def _maybe_crash(self, step: str) -> None:
        """Tests only (``test_crash_in_install``): exit at this step of the first install."""
        if self.config.test_crash_in_install != step:
            return
        marker = os.path.join(self.config.data_dir, "test-crashed-in-install")
        if not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(step)
            log.error("%s: exiting at the install step %r (test_crash_in_install)",
                      self.config.node_id, step)
            os._exit(70)

    async def _stop_snapshots(self) -> None:
        tasks = list(self._snapshot_sends.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._receiver is not None:
            await self._receiver.stop()

    def snapshot_status(self) -> dict[str, int | list[str]]:
        r = self._receiver
        return {"index": self._snapshot_meta.index if self._snapshot_meta else 0,
                "sending_to": sorted(self._snapshot_sends), "sent": self.snapshots_sent,
                "send_failures": self.snapshot_send_failures,
                "resumed_bytes": self.snapshot_resumed_bytes,
                "received": r.received if r else 0, "refused": r.refused if r else 0,
                "installed": self.snapshots_installed}

