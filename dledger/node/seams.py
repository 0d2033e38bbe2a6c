"""What a node runs on (``NodeSeams``, a part of ``dledger.node.runtime.Node``): its log store,
hard-state store and transport, in the spirit of hashicorp/raft's ``NewRaft(conf, fsm, logs,
stable, snaps, transport)``.

Each is given to the node (``Node(config, log_store=..., hard_state=..., transport=...)``: any
``dledger.storage.seams.LogStore``, ``HardStateStore`` and ``dledger.network.seams.Transport``,
such as the in-memory ones a test runs real nodes on) or else is the node's own, built from its
configuration as a server process needs: the ``FileLogStore`` in ``<data_dir>/log``, the
``FileHardStateStore`` in ``<data_dir>/hardstate`` and ``PeerTransport``'s TCP links.

Owns opening them, the flusher that suits the log store (``Flusher`` for a ``FileLogStore``:
background fsyncs through Linux AIO or the fsync thread, spin-waited inline ones;
``StoreFlusher``, the store's plain ``sync()``, for any other), closing what the node opened (a
given store stays open: its owner closes it; a given transport, like its own, is started and
stopped by the node) and the test-only power loss. What needs the node's own files refuses or
degrades: snapshots (installed by replacing the log directory's files, streamed over TCP) need
the node's own log and a ``PeerTransport``; the recovering marker of a ``--join`` node is a
file beside its own hard state, else kept in memory; a full disk's recovery reopens only the
node's own log (``dledger.node.disk_full``); retention's rules on segment files' ages look at a
``FileLogStore`` only.
"""

from __future__ import annotations

import os
import random

from dledger.network.seams import OnMessage, OnStream, Resolve, Transport
from dledger.network.transport import PeerTransport
from dledger.node.base import NodeBase
from dledger.node.config import Address
from dledger.raft.types import HardState
from dledger.storage.aiofsync import open_aio_fsync, open_spin_sync
from dledger.storage.commitlog import FileLogStore
from dledger.storage.flush import Flusher, Flushing, StoreFlusher
from dledger.storage.hardstate import FileHardStateStore
from dledger.storage.memstore import MemoryLogStore
from dledger.storage.seams import HardStateStore, LogStore
from protocol.errors import StorageError

__all__ = ["HARD_STATE_FILE", "LOG_DIR", "NodeSeams"]

LOG_DIR = "log"  # the node's own log, under its data directory
HARD_STATE_FILE = "hardstate"


class NodeSeams(NodeBase):
    """The stores and the transport of a node (a part of ``dledger.node.runtime.Node``)."""

    @property
    def _owns_files(self) -> bool:
        """Whether the node keeps its log and hard state in its data directory (else it was
        given both stores, and writes no file of its own there)."""
        return self._given_log is None or self._given_hard_state is None

    def _check_seams(self) -> None:
        """Before start: refuse what the given seams cannot do (snapshots)."""
        if self._snapshot_provider is None:
            return
        if self._given_log is not None:
            raise ValueError("snapshots need the node's own log (an install replaces its files)")
        given = self._given_transport
        if given is not None and not isinstance(given, PeerTransport):
            raise ValueError("snapshots need a PeerTransport (they are streamed over TCP)")

    def _open_hard_state(self) -> tuple[HardStateStore, bool]:
        """The hard-state store, and whether it holds a saved state (a term or vote)."""
        given = self._given_hard_state
        if given is not None:
            return given, given.load() != HardState()
        path = os.path.join(self.config.data_dir, HARD_STATE_FILE)
        return FileHardStateStore(path), os.path.exists(path)

    def _open_log(self) -> LogStore:
        """The given log store, synced, or the node's own opened and recovered (at start, and
        again after a full disk)."""
        if self._given_log is not None:
            # What it shows counts as durable from here (the core starts from it), as what the
            # file log recovers on open is fsynced there.
            self._given_log.sync()
            return self._given_log
        cfg = self.config
        return FileLogStore.open(os.path.join(cfg.data_dir, LOG_DIR),
                                 segment_bytes_max=cfg.segment_bytes_max,
                                 verify_checksums=not cfg.canaries.skip_checksum)

    def _close_log(self) -> None:
        """Close the log store if the node opened it (a given one is its owner's to close)."""
        if self.store is not None and self._given_log is None:
            self.store.close()

    def _open_transport(self, on_message: OnMessage, on_stream: OnStream | None,
                        resolve: Resolve) -> Transport:
        """The given transport, attached to the node's callbacks, or its own TCP links."""
        cfg = self.config
        given = self._given_transport
        if given is not None:
            given.attach(on_message, on_batch_end=self._kick, on_stream=on_stream,
                         resolve=resolve)
            return given
        dial: dict[str, Address] = {p: cfg.dial.get(p, addr) for p, addr in cfg.peers.items()
                                    if p != cfg.node_id}
        return PeerTransport(cfg.node_id, cfg.group, cfg.listen or cfg.peers[cfg.node_id], dial,
                             on_message, rng=random.Random(self._rng.random()),
                             on_batch_end=self._kick, on_stream=on_stream, resolve=resolve,
                             server_ssl=cfg.tls.peer_server_context() if cfg.tls else None,
                             # (asked at each dial: a SIGHUP's reload applies to the next one)
                             dial_ssl=cfg.tls.peer_client_context if cfg.tls else None,
                             peer_identity=cfg.tls is not None and cfg.tls.peer_mtls)

    def _open_flusher(self, store: LogStore) -> Flushing:
        if not isinstance(store, FileLogStore):
            return StoreFlusher(store, self._kick, self.stats)
        cfg = self.config
        spin = open_spin_sync(cfg.busy_poll_us / 1e6) if cfg.busy_poll_us else None
        aio = open_aio_fsync() if cfg.aio_fsync else None
        return Flusher(store, self._kick, self._on_flush_failure, spin, aio, self.stats)

    def _lose_power(self, tear: bool) -> int:
        """Test-only (``power_loss``): discard what the log store wrote since its last sync.
        Returns the bytes discarded (a ``FileLogStore``) or the entries (a ``MemoryLogStore``,
        which keeps a random prefix of its unsynced writes when ``tear``)."""
        store = self._store()
        if isinstance(store, FileLogStore):
            return store.power_loss(self._rng, tear=tear)
        if isinstance(store, MemoryLogStore):
            return store.power_loss(self._rng if tear else None)
        raise StorageError(f"a {type(store).__name__} models no power loss")
