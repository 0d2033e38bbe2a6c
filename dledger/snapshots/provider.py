"""The snapshot seam: what an application (the broker) gives a node so that it can send and
install snapshots of the application's state (``SnapshotProvider``). A contract only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from dledger.raft.types import SnapshotMeta

__all__ = ["SnapshotProvider"]


class SnapshotProvider(Protocol):
    """What an application gives a node for snapshots (the broker's ``BrokerServer``)."""

    def snapshot_source(self) -> tuple[int, list[tuple[str, int]]] | None:
        """The applied index of its latest durable state and that state's files, as (name in
        the data directory, a file descriptor opened now, which the node closes); None if it
        has none yet. Called on the event loop."""
        ...

    def snapshot_derived(self) -> Sequence[str]:
        """Names in the data directory it rebuilds from its state and the log (deleted when a
        snapshot is installed)."""
        ...

    async def snapshot_installing(self) -> None:
        """A snapshot is about to replace its files: finish (and hold off) writing them."""
        ...

    def snapshot_installed(self, meta: SnapshotMeta) -> None:
        """A snapshot was installed: its files replaced the application's and the log now
        starts where the snapshot's does; reload from them. Called on the event loop, always
        after ``snapshot_installing``."""
        ...
