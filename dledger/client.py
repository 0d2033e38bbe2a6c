"""The log's client: propose with leader redirects, read, status, transfer, on the servers of
one replicated-log group (``dledger.server``). Connections, deadlines and the retry rule are
``protocol.group_client``'s: a proposal is retried on another node only when it certainly was not
appended; when the outcome is unknown the caller gets the named error.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from dledger.node.config import AppliedEntry, Committed
from dledger.raft.types import EntryKind
from protocol.envelope import POWER_LOSS, PROPOSE, PROPOSE_BATCH, READ, STATUS, TRANSFER
from protocol.errors import DLedgerError
from protocol.group_client import (
    ConnectionLostError,
    GroupClient,
    UnavailableError,
    UnknownLeaderError,
    UnknownNodeError,
)

__all__ = ["ConnectionLostError", "LogClient", "UnavailableError", "UnknownLeaderError",
           "UnknownNodeError"]


class LogClient(GroupClient):
    """A ``GroupClient`` of a replicated-log group, with the log server's requests."""

    async def __aenter__(self) -> LogClient:
        return self

    # -- proposals with redirects -------------------------------------------------------------------

    async def propose(self, data: bytes, timeout_s: float | None = None) -> tuple[str, Committed]:
        """Commit data through the leader; returns (node that answered, where it landed)."""
        node, result = await self.call_leader(PROPOSE, data, timeout_s=timeout_s)
        return node, Committed(*result)

    async def propose_batch(self, items: list[bytes],
                            timeout_s: float | None = None) -> tuple[str, list[Committed]]:
        node, result = await self.call_leader(PROPOSE_BATCH, items, timeout_s=timeout_s)
        return node, [Committed(*r) for r in result]

    async def wait_for_leader(self, timeout_s: float) -> str:
        """Wait until the group commits (an empty entry, proving it works); returns the leader."""
        deadline = time.monotonic() + timeout_s
        last: DLedgerError | None = None
        while time.monotonic() < deadline:
            try:
                node, _ = await self.propose(b"", timeout_s=max(0.1, min(2.0, deadline - time.monotonic())))
                return node
            except DLedgerError as err:
                last = err
                await asyncio.sleep(0.1)
        raise UnavailableError(f"no leader committed within {timeout_s} s: {last}")

    # -- other requests -------------------------------------------------------------------------------

    async def status(self, node: str) -> dict[str, Any]:
        status: dict[str, Any] = await self.call(node, STATUS)
        return status

    async def read(self, node: str, lo: int, max_entries: int = 1024) -> list[AppliedEntry]:
        rows = await self.call(node, READ, lo, max_entries)
        return [AppliedEntry(i, t, EntryKind(k), d, p) for i, t, k, d, p in rows]

    async def read_all(self, node: str) -> list[AppliedEntry]:
        out: list[AppliedEntry] = []
        for _ in range(1_000_000):
            batch = await self.read(node, len(out) + 1 if not out else out[-1].index + 1)
            if not batch:
                return out
            out.extend(batch)
        return out

    async def transfer(self, node: str, to: str) -> None:
        await self.call(node, TRANSFER, to, timeout_s=10.0)

    async def power_loss(self, node: str, tear: bool = False) -> int:
        discarded: int = await self.call(node, POWER_LOSS, tear)
        return discarded
