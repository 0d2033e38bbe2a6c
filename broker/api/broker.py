"""One broker node's state machine, log and services (``Broker``): what every front end's request
reaches, through the broker API (``broker.api.api``), and what every feature's service and
handler works on, each through a narrow protocol of its own (``broker.features.host``).

Owns the glue between the log and the state machine: every committed entry is applied to the
state in log order (on the leader and on followers, so followers serve reads of committed data),
the key index follows the apply, long polls wake on arrivals, and a proposal's caller gets the
apply result of its entry. Reads (pulls, message reads) are served from this node's state and
commitlog; writes need this node to lead (``require_leader``). Listeners, the admin endpoints,
registration and metrics are the server's (``broker.server``).
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from broker.api.sendgroup import RunTally
from broker.api.sendpath import SendPath
from broker.config import BrokerConfig
from broker.core.applied import ApplyResult
from broker.core.codec import Message, message_of
from broker.core.members import GroupMembers
from broker.core.read_filter import ReadFilter
from broker.features.acl.service import AclService
from broker.features.clients.service import ConsumerConnections
from broker.features.delay.model import SCHEDULE_TOPIC
from broker.features.delay.service import DelayService
from broker.features.orderly.service import LockService
from broker.features.pop.service import PopService
from broker.features.query.index import KeyIndex, open_index
from broker.features.retry.service import RetryService
from broker.features.txn.service import TxnService
from broker.machine.parts import STATE_CANARIES
from broker.machine.state import BrokerState, StateConfig
from broker.shell.checkpoint import SNAPSHOT_DERIVED, Checkpoints, load_checkpoint
from dledger.node.config import AppliedEntry, Committed
from dledger.node.runtime import Node
from dledger.raft.types import EntryKind
from dledger.snapshots.files import finish_install
from protocol.broker_errors import BrokerError
from protocol.broker_kinds import (
    FOUND,
    MAX_PULL_MESSAGES,
    MAX_SUSPEND_MS,
    NO_NEW_MSG,
    OFFSET_OUT_OF_RANGE,
    SendRefusedError,
    offset_msg_id,
    unscoped,
)
from protocol.errors import DiskFullError, NotLeaderError
from protocol.filter_sql import SqlFilter

__all__ = ["RESULTS_KEPT", "Broker", "BrokerMetrics"]

RESULTS_KEPT = 100_000  # apply results kept for senders still waiting on them


class BrokerMetrics(Protocol):
    """What the broker counts as work happens (``broker.shell.metrics``; nothing by default)."""

    def sent(self, runs: Sequence[RunTally], answers: Sequence[Any], started_s: float) -> None:
        ...

    def proposed(self, fut: asyncio.Future[Committed]) -> None: ...

    def pulled(self, topic: str, result: str, messages: list[Any]) -> None: ...

    def passed_expired(self, path: str, count: int) -> None: ...


class _Uncounted:
    def sent(self, runs: Sequence[RunTally], answers: Sequence[Any], started_s: float) -> None:
        return

    def proposed(self, fut: asyncio.Future[Committed]) -> None:
        return

    def pulled(self, topic: str, result: str, messages: list[Any]) -> None:
        return

    def passed_expired(self, path: str, count: int) -> None:
        return


class Broker:
    def __init__(self, config: BrokerConfig, served_kinds: frozenset[int]) -> None:
        self.config = config
        self.group = config.node.group
        self.state_config = StateConfig(canaries=config.canaries & STATE_CANARIES)
        verify = not config.node.canaries.skip_checksum
        # A snapshot install a crash cut short is finished before anything is read.
        finish_install(config.node.data_dir, "log", SNAPSHOT_DERIVED)
        self.state: BrokerState = load_checkpoint(config.node.data_dir, verify, self.state_config,
                                                  queue_files=True, canaries=config.canaries)
        # The key index catches up with the checkpoint from the log, then follows the apply.
        self.index: KeyIndex = open_index(config.node.data_dir, config.index, self.state.registry,
                                          self.state.applied_index, verify)
        # The log replays only what the checkpoint does not cover.
        self.node = Node(config.node, applied_index=self.state.applied_index)
        self.checkpoints = Checkpoints(self, config.checkpoint_interval_s)
        self.node.set_snapshot_provider(self.checkpoints)
        self.results: OrderedDict[int, ApplyResult] = OrderedDict()
        self.members = GroupMembers()
        self.consumers = ConsumerConnections()  # those that can be asked (307 / 309)
        self._arrivals: dict[tuple[str, int], asyncio.Event] = {}
        self.metrics: BrokerMetrics = _Uncounted()
        self.expired_passed = {"pull": 0, "pop": 0}  # expired messages reads passed over
        self.status_of: Callable[[], dict[str, Any]] = lambda: {"group": self.group}
        self.node.add_apply_listener(self._on_apply)
        self.sends = SendPath(self)
        self.acl = AclService(self, served_kinds)
        self.delays = DelayService(self)
        self.retries = RetryService(self)
        self.locks = LockService(self)
        self.txns = TxnService(self)
        self.pops = PopService(self)

    async def start_services(self) -> None:
        """Once the node runs and the listeners are up: checkpoints and the leader's loops."""
        self.checkpoints.start()
        self.delays.start()
        self.txns.start()

    async def stop_services(self) -> None:
        await self.delays.stop()
        await self.txns.stop()
        await self.checkpoints.stop()  # (writes a last checkpoint)

    async def close(self) -> None:
        await self.node.stop()
        self.index.close()
        self.state.queue_store.close()

    def status(self) -> dict[str, Any]:
        """The node's status, as BROKER_STATUS answers it (the server's, once it runs)."""
        return self.status_of()

    # -- the state machine, fed by the log --------------------------------------------------------

    def _on_apply(self, batch: Sequence[AppliedEntry]) -> None:
        # Only a leader's proposers wait for results (a proposal fails when leadership is
        # lost): a follower keeps none, which saved it ~50 MB per million messages applied.
        keep = self.node.is_leader
        index = self.index
        for e in batch:
            data = e.data if e.kind is EntryKind.NORMAL else b""
            result = self.state.apply(e.index, e.position, data)
            index.add(e.index, e.position, self.state.last_entry)
            if keep:
                self.results[e.index] = result
            if result.status == "SEND_OK":
                for run in result.run_results():
                    if run.topic == SCHEDULE_TOPIC:
                        self.delays.wake()  # a new timer may be due before the service's next look
                    arrival = self._arrivals.pop((run.topic, run.queue_id), None)
                    if arrival is not None:
                        arrival.set()  # wake long polls on this queue
        index.end_batch()
        while len(self.results) > RESULTS_KEPT:
            self.results.popitem(last=False)

    async def commit(self, data: bytes) -> ApplyResult:
        """Propose an entry through this node and wait for its apply result."""
        committed = await self.node.propose(data, self.config.send_timeout_s)
        result = self.results.pop(committed.index, None)
        if result is None:  # applied before we looked and already trimmed: cannot happen in time
            raise BrokerError(f"no apply result for entry {committed.index}")
        return result

    def require_leader(self) -> None:
        core = self.node.core
        if self.node.disk_full is not None:  # refused by name; it takes no part for now
            raise DiskFullError(f"{self.group}/{core.id if core else '?'} cannot write: "
                                f"{self.node.disk_full}")
        if core is None or not self.node.is_leader:
            raise NotLeaderError(core.leader_id if core else None, core.term if core else 0)

    async def leader_commit(self, entry: object) -> ApplyResult:
        """Commit an entry through this node (the leader); named error if refused."""
        self.require_leader()
        result = await self.commit(self.state.registry.encode(entry))
        if result.status not in ("OK", "SEND_OK"):
            raise SendRefusedError(result.status, result.detail)
        return result

    def caught_up(self) -> bool:
        """Whether this node's state reflects what its group has committed: it knows a leader,
        has applied its commit index, and, as leader, has applied its own term's no-op (so its
        topic list is not a stale or empty one, e.g. right after a restart)."""
        core = self.node.core
        if core is None or core.leader_id is None or self.node.disk_full is not None:
            return False
        if self.state.applied_index < core.log.commit_index:
            return False
        return not self.node.is_leader or self.state.applied_index >= core.term_start_index

    # -- reads ----------------------------------------------------------------------------------

    async def pull(self, topic: str, queue_id: int, offset: int, max_messages: int,
                   max_bytes: int, suspend_ms: int, tags: list[str],
                   sql: SqlFilter | None = None) -> list[Any]:
        """PULL and PULL_SQL: the messages of one queue from ``offset``, those whose tag hash is
        in ``tags`` (``*``: any), and that match ``sql``. Filtered messages are skipped, their
        offsets passed: ``next_offset`` follows the last unit examined."""
        answer = await self._pull(topic, queue_id, offset, max_messages, max_bytes, suspend_ms,
                                  tags, sql)
        self.metrics.pulled(topic, answer[0], answer[4])
        return answer

    def count_expired(self, path: str, count: int) -> None:
        """``count`` expired messages (``protocol.message_ttl``) a read on ``path`` passed."""
        self.expired_passed[path] += count
        self.metrics.passed_expired(path, count)

    async def _pull(self, topic: str, queue_id: int, offset: int, max_messages: int,
                    max_bytes: int, suspend_ms: int, tags: list[str],
                    sql: SqlFilter | None) -> list[Any]:
        lo, hi = self.state.queue_range(topic, queue_id)
        lo = max(lo, self.retained_offset(topic, queue_id))
        if offset < lo or offset > hi:
            return [OFFSET_OUT_OF_RANGE, offset, lo, hi, []]
        if offset == hi and suspend_ms > 0:
            await self.wait_arrival(topic, queue_id, min(suspend_ms, MAX_SUSPEND_MS) / 1000)
            lo, hi = self.state.queue_range(topic, queue_id)
        if offset >= hi:
            return [NO_NEW_MSG, offset, lo, hi, []]
        # by tag hash (the clients check tags exactly), SQL92, TTL by this node's clock
        passes = ReadFilter(tags, sql, int(time.time() * 1000), exact_tags=False)
        entries: dict[int, list[Any]] = {}  # each entry decoded once per pull
        units = self.state.units(topic, queue_id, offset, min(max_messages, MAX_PULL_MESSAGES))
        out: list[Any] = []
        size = 0
        next_offset = offset
        for k, unit in enumerate(units):
            if out and size + unit.size > max_bytes:
                break
            next_offset = offset + k + 1
            m = passes.examine(self, unit, entries)
            if m is None:
                continue  # (an expired one is never delivered: passed as a filtered one)
            size += unit.size
            out.append([offset + k, m.body, m.tags, list(m.keys), unscoped(m.unique_key),
                        [list(p) for p in m.properties], m.born_ts_ms, unit.store_ts_ms,
                        offset_msg_id(self.group, unit.position, unit.slot)])
        if passes.expired:
            self.count_expired("pull", passes.expired)
        return [FOUND if out else NO_NEW_MSG, next_offset, lo, hi, out]

    def retained_offset(self, topic: str, queue_id: int) -> int:
        """The queue's first offset whose message the local log still holds: log retention
        (``--retention-entries``) deletes old segments, and the queue's min offset follows. The
        state machine keeps its units (it is identical on every replica; retention is local)."""
        store = self.node.store
        if store is None or store.first_index() == 1 or store.last_index() < store.first_index():
            return 0  # nothing retained away (the usual case: retention is off by default)
        first_position = store.position_of(store.first_index())
        units = self.state.queues.get((topic, queue_id))
        if units is None:
            return 0
        return bisect.bisect_left(units, first_position, lo=units.first(),
                                  key=lambda u: u.position)

    def arrival(self, topic: str, queue_id: int) -> asyncio.Event:
        """Set when the next message for the queue is applied here (long polls wait on it)."""
        return self._arrivals.setdefault((topic, queue_id), asyncio.Event())

    async def wait_arrival(self, topic: str, queue_id: int, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self.arrival(topic, queue_id).wait(), timeout_s)
        except TimeoutError:
            return

    def stored_message(self, position: int, slot: int) -> list[Any]:
        """The message at ``slot`` of the entry at commitlog ``position``, in entry form."""
        store = self.node.store
        if store is None:
            raise BrokerError("the node is not started")
        return list(self.state.registry.stored_messages(store.read_at(position).data)[slot])

    def read_message(self, position: int, slot: int, entries: dict[int, list[Any]]) -> Message:
        """As ``stored_message``, as a ``Message``; ``entries`` caches the entries decoded."""
        messages = entries.get(position)
        if messages is None:
            store = self.node.store
            if store is None:
                raise BrokerError("the node is not started")
            messages = entries[position] = self.state.registry.stored_messages(
                store.read_at(position).data)
        return message_of(messages[slot])  # only the messages pulled are built

    def heartbeat(self, client_id: str, group: str, model: str, subs: dict[str, str],
                  ttl_s: float, connection: object = None) -> list[str]:
        """A consumer's heartbeat (ttl 0: it leaves); the group's live members on this node.
        ``connection``: the one it came on, kept if the broker can ask the consumer on it or
        tell it of a change of its group's members (the others are told at once)."""
        self.consumers.heartbeat(client_id, group, connection, ttl_s)
        live = self.members.heartbeat(client_id, group, model, subs, ttl_s, time.monotonic())
        if self.members.untold(group) and self.config.notify_consumers:
            self.consumers.members_changed(group, client_id)  # joined, left, expired, resubscribed
        return live
