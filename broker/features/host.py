"""What a feature's service or handlers may use of the broker they run in: ``BrokerHost``, a
narrow protocol (never the server itself; ``broker.api.broker.Broker`` is the one that fills it).
A service that needs more names it in a protocol of its own that extends this one.

Reads go to the state machine (``state``) and the commitlog (``stored_message``); writes go
through the log (``commit`` a payload, ``leader_commit`` an entry), on the leader only
(``require_leader`` names the refusal; ``caught_up`` says whether a new leader has applied its
predecessor's entries yet).
"""

from __future__ import annotations

from typing import Any, Protocol

from broker.config import BrokerConfig
from broker.core.applied import ApplyResult
from broker.machine.state import BrokerState
from dledger.node.runtime import Node

__all__ = ["BrokerHost"]


class BrokerHost(Protocol):
    @property
    def config(self) -> BrokerConfig: ...

    @property
    def group(self) -> str: ...

    @property
    def state(self) -> BrokerState: ...

    @property
    def node(self) -> Node: ...

    def require_leader(self) -> None:
        """Raise NotLeaderError (or DiskFullError) unless this node leads and may write."""

    def caught_up(self) -> bool:
        """Whether this node has applied what its group committed (as leader: its term's start)."""
        ...

    async def commit(self, data: bytes) -> ApplyResult:
        """Propose a payload through this node and wait for its apply result."""
        ...

    async def leader_commit(self, entry: object) -> ApplyResult:
        """Commit an entry on the leader; a refusal at apply raises its named error."""
        ...

    def stored_message(self, position: int, slot: int) -> list[Any]:
        """The message at ``slot`` of the entry at commitlog ``position``, in entry form."""
        ...
