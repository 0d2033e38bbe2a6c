"""A broker node: a replicated-log node whose committed entries drive ``BrokerState``, and a client
port for sends, pulls (with long polling), topic admin and consumer offsets.

Owns request handling and the glue between the log and the state machine: every committed entry
is applied to the state in log order (on the leader and on followers, so followers serve pulls of
committed data); a send returns once its entry is committed and applied, with the queue offsets
the state machine assigned. Writes to a follower are answered NOT_LEADER with the leader's id.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import logging
import time
from collections import OrderedDict
from typing import Any, Sequence

from aiohttp import web

from broker.shell.http import make_app
from broker.config import BROKER_CANARIES as BROKER_CANARIES  # (re-exported)
from broker.config import BrokerConfig as BrokerConfig
from broker.shell.checkpoint import (  # noqa: F401 - (CHECKPOINT_FILE, save_checkpoint: re-exported)
    CHECKPOINT_FILE,
    QUEUE_CANARIES,
    SNAPSHOT_DERIVED,
    Checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from broker.features.delay.model import SCHEDULE_TOPIC
from broker.features.delay.service import DelayService
from broker.features.orderly.service import LockService
from broker.features.retry.service import RetryService
from broker.core.entries import Message
from broker.machine.kinds import encode, stored_messages
from broker.core.codec import message_of
from protocol.broker_errors import BadEntryError, BadRequestError, BrokerError
from protocol.filter_sql import SqlFilter
from broker.features.acl.service import AclService
from broker.shell.metrics import BrokerMetrics
from protocol.auth import SIGNED, AccessDeniedError, SignatureError
from broker.core.members import GroupMembers
from broker.core.requests import dispatch, served_kinds
from broker.features.txn.service import TxnService
from broker.features.query.index import KeyIndex, open_index
from protocol.broker_kinds import (
    FOUND,
    MAX_PULL_MESSAGES,
    MAX_SUSPEND_MS,
    NO_NEW_MSG,
    OFFSET_OUT_OF_RANGE,
    SEND,
    SEND_KINDS,
    SendRefusedError,
    offset_msg_id,
)
from broker.features.pop.service import PopService
from broker.shell.registrar import Registrar
from broker.api.sendpath import SendPath
from broker.core.applied import ApplyResult, tag_hash
from broker.machine.parts import STATE_CANARIES
from broker.core.state import StateConfig
from protocol.errors import DiskFullError, DLedgerError, NotLeaderError, WireError
from protocol.framed import (
    ConnectionLimits,
    FramedProtocol,
)
from protocol.envelope import (
    Request,
    decode_request,
    encode_decode_error,
    encode_error,
    encode_result,
)
from dledger.raft.types import EntryKind
from dledger.snapshots.files import finish_install
from dledger.node.runtime import Address, AppliedEntry, Node
from dledger.server import status_dict

log = logging.getLogger("broker.server")

SERVED_KINDS = served_kinds()
ACCEPTED_KINDS = SERVED_KINDS | {SIGNED}  # a signed envelope wraps one of the served kinds
RESULTS_KEPT = 100_000  # apply results kept for senders still waiting on them
OFFSET_GROUPS_SHOWN_BYTES = 16 << 10  # consumer groups with committed offsets named in the
#                                      status: the first names, as JSON, within this budget
#                                      (the status stays far under a reader's 256 KiB bound)


class _Connection(FramedProtocol):
    def __init__(self, server: BrokerServer) -> None:
        super().__init__(limits=server.limits)
        self.server = server
        self.tasks: set[asyncio.Task[None]] = set()

    def framing_failed(self, err: WireError) -> None:
        log.warning("closing client connection: %s", err)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.server.txns.producers.drop(self)  # its producers can no longer be asked

    def payload_received(self, payload: bytes) -> None:
        try:
            req = decode_request(payload, ACCEPTED_KINDS)
        except WireError as err:
            self.send_payload(encode_decode_error(err))
            return
        acl = self.server.acl
        if acl.enabled or req.kind == SIGNED:
            try:
                req = acl.admit(req)
            except NotLeaderError as err:  # a new leader still applying (broker.features.acl.service)
                self.send_payload(encode_error(req.request_id, err))
                return
            except (SignatureError, AccessDeniedError, BadRequestError) as err:
                self.server.metrics.refused(err)
                self.send_payload(encode_error(req.request_id, err))
                return
        if req.kind in SEND_KINDS and self.server.sends.handle(req, self):
            return
        task = asyncio.ensure_future(self.server.handle(req, self))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


class BrokerServer:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.group = config.node.group
        self.state_config = StateConfig(canaries=config.canaries & STATE_CANARIES)
        # A snapshot install a crash cut short is finished before anything is read.
        finish_install(config.node.data_dir, "log", SNAPSHOT_DERIVED)
        self.state = load_checkpoint(config.node.data_dir, not config.node.canaries.skip_checksum,
                                     self.state_config, queue_files=True, canaries=config.canaries)
        # The key index catches up with the checkpoint from the log, then follows the apply.
        self.index: KeyIndex = open_index(config.node.data_dir, config.index, self.state.registry,
                                          self.state.applied_index,
                                          not config.node.canaries.skip_checksum)
        # The log replays only what the checkpoint does not cover.
        self.node = Node(config.node, applied_index=self.state.applied_index)
        self.checkpoints = Checkpoints(self, config.checkpoint_interval_s)
        self.node.set_snapshot_provider(self.checkpoints)
        self.results: OrderedDict[int, ApplyResult] = OrderedDict()
        self.members = GroupMembers()
        self._arrivals: dict[tuple[str, int], asyncio.Event] = {}
        self._server: asyncio.Server | None = None
        self.client_address: Address | None = None
        self.admin_address: Address | None = None
        self.grpc_address: Address | None = None  # where RocketMQ 5 clients are served
        self._gateway: Any = None  # a GrpcGateway (imported only when asked for: grpcio)
        self._admin: web.AppRunner | None = None
        self.limits = ConnectionLimits(config.max_connections, config.input_buffer_bytes_max)
        self.acl = AclService(self, SERVED_KINDS)
        self.registrar = Registrar(self, list(config.namesrv), config.register_interval_s)
        self.node.add_apply_listener(self._on_apply)
        self.metrics = BrokerMetrics(self)
        self.sends = SendPath(self)
        self.delays = DelayService(self)
        self.retries = RetryService(self)
        self.locks = LockService(self)
        self.txns = TxnService(self)
        self.pops = PopService(self)

    async def start(self) -> None:
        await self.node.start()
        self.metrics.attach()
        loop = asyncio.get_running_loop()
        host, port = self.config.client_listen
        tls = self.config.node.tls  # (protocol.tls) on the client, admin and gRPC listeners too
        self._server = await loop.create_server(lambda: _Connection(self), host, port,
                                                ssl=tls.server_context() if tls else None)
        sock = self._server.sockets[0].getsockname()
        self.client_address = (sock[0], sock[1])
        if self.config.admin_listen is not None:
            self._admin = web.AppRunner(make_app(self), access_log=None)
            await self._admin.setup()
            await web.TCPSite(self._admin, *self.config.admin_listen,
                              ssl_context=tls.server_context() if tls else None).start()
            host, port = self._admin.addresses[0][:2]
            self.admin_address = (host, port)
        if self.config.grpc_listen is not None:
            from broker.frontends.grpc.gateway import GrpcGateway
            self._gateway = GrpcGateway(self, self.config.grpc_listen)
            self.grpc_address = self.config.registered("grpc", await self._gateway.start())
        if self.config.namesrv:
            self.registrar.start()
        self.checkpoints.start()
        self.delays.start()
        self.txns.start()

    async def stop(self) -> None:
        await self.delays.stop()
        await self.txns.stop()
        await self.checkpoints.stop()
        if self.config.namesrv:
            await self.registrar.stop()
        if self._gateway is not None:
            await self._gateway.stop()
        if self._admin is not None:
            await self._admin.cleanup()
        if self._server is not None:
            self._server.close()
        await self.node.stop()
        self.index.close()
        self.state.queue_store.close()

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

    # -- requests -------------------------------------------------------------------------------------

    async def handle(self, req: Request, conn: _Connection) -> None:
        try:
            result = await self._dispatch(req, conn)
        except (DLedgerError, BrokerError) as err:
            conn.send_payload(encode_error(req.request_id, err))
        except (TypeError, ValueError, IndexError, OverflowError, KeyError, AttributeError) as err:
            conn.send_payload(encode_error(req.request_id, BadEntryError(f"bad request: {err}")))
        else:
            conn.send_payload(encode_result(req.request_id, result))

    async def _dispatch(self, req: Request, conn: _Connection) -> Any:
        a = req.args
        if req.kind == SEND:
            return await self.send(a[0], a[1], a[2])
        return await dispatch(self, req, conn)  # every other kind: the table in broker.core.requests

    def require_leader(self) -> None:
        core = self.node.core
        if self.node.disk_full is not None:  # refused by name; it takes no part for now
            raise DiskFullError(f"{self.group}/{core.id if core else '?'} cannot write: "
                                f"{self.node.disk_full}")
        if core is None or not self.node.is_leader:
            raise NotLeaderError(core.leader_id if core else None, core.term if core else 0)

    async def leader_commit(self, entry: Any) -> ApplyResult:
        """Commit a control entry through this node (the leader); named error if refused."""
        self.require_leader()
        result = await self.commit(encode(entry))
        if result.status not in ("OK", "SEND_OK"):
            raise SendRefusedError(result.status, result.detail)
        return result

    async def send(self, topic: str, queue_id: int, raw: list[Any]) -> list[Any]:
        """SEND awaited (a request that did not take the connection's fast path)."""
        return await self.sends.send(topic, queue_id, raw)

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

    async def _pull(self, topic: str, queue_id: int, offset: int, max_messages: int,
                    max_bytes: int, suspend_ms: int, tags: list[str],
                    sql: SqlFilter | None) -> list[Any]:
        lo, hi = self.state.queue_range(topic, queue_id)
        lo = max(lo, self._retained_offset(topic, queue_id))
        if offset < lo or offset > hi:
            return [OFFSET_OUT_OF_RANGE, offset, lo, hi, []]
        if offset == hi and suspend_ms > 0:
            await self._wait_arrival(topic, queue_id, min(suspend_ms, MAX_SUSPEND_MS) / 1000)
            lo, hi = self.state.queue_range(topic, queue_id)
        if offset >= hi:
            return [NO_NEW_MSG, offset, lo, hi, []]
        wanted = {tag_hash(t) for t in tags if t != "*"} if tags and "*" not in tags else None
        entries: dict[int, list[Any]] = {}  # each entry decoded once per pull
        units = self.state.units(topic, queue_id, offset, min(max_messages, MAX_PULL_MESSAGES))
        out: list[Any] = []
        size = 0
        next_offset = offset
        for k, unit in enumerate(units):
            if out and size + unit.size > max_bytes:
                break
            next_offset = offset + k + 1
            if wanted is not None and unit.tag_hash not in wanted:
                continue  # filtered by tag hash on the broker; clients check tags exactly
            m = self._read_message(unit.position, unit.slot, entries)
            if sql is not None and not sql.matches(dict(m.properties), m.tags):
                continue  # SQL92 filtering is the broker's alone: the client trusts it
            size += unit.size
            out.append([offset + k, m.body, m.tags, list(m.keys), m.unique_key,
                        [list(p) for p in m.properties], m.born_ts_ms, unit.store_ts_ms,
                        offset_msg_id(self.group, unit.position, unit.slot)])
        return [FOUND if out else NO_NEW_MSG, next_offset, lo, hi, out]

    def _retained_offset(self, topic: str, queue_id: int) -> int:
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

    async def _wait_arrival(self, topic: str, queue_id: int, timeout_s: float) -> None:
        event = self._arrivals.setdefault((topic, queue_id), asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            return

    def _read_message(self, position: int, slot: int, entries: dict[int, list[Any]]) -> Message:
        messages = entries.get(position)
        if messages is None:
            store = self.node.store
            assert store is not None
            messages = entries[position] = stored_messages(store.read_at(position).data)
        return message_of(messages[slot])  # only the messages pulled are built

    def heartbeat(self, client_id: str, group: str, model: str, subs: dict[str, str],
                  ttl_s: float) -> list[str]:
        """A consumer's heartbeat (ttl 0: it leaves); the group's live members on this node."""
        return self.members.heartbeat(client_id, group, model, subs, ttl_s, time.monotonic())

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

    def status(self) -> dict[str, Any]:
        st = status_dict(self.node, self.client_address)
        st["topics"] = {t.name: {"read_queues": t.read_queues, "write_queues": t.write_queues,
                                 "perm": t.perm} for t in self.state.topics.values()}
        st["applied_index"] = self.state.applied_index
        st["caught_up"] = self.caught_up()  # what /readyz answers: its state is the group's
        st["admin_address"] = list(self.admin_address or ())
        st["consumer_groups"] = self.members.snapshot(time.monotonic())
        st["offset_groups"] = _shown(sorted({k[0] for k in self.state.offsets}))
        st["client_connections"] = self.limits.stats()
        st["timers"] = self.delays.status()
        st["retries"] = self.retries.status()
        st["transactions"] = self.txns.status()
        st["pop"] = self.pops.status()
        st["key_index"] = self.index.status()
        st["snapshot"] = {**self.node.snapshot_status(),
                          "checkpoint_index": self.checkpoints.checkpointed_index}
        return st


def _shown(names: list[str]) -> list[str]:
    """The first of ``names`` whose JSON fits ``OFFSET_GROUPS_SHOWN_BYTES``."""
    out, used = [], 0
    for name in names:
        used += len(json.dumps(name)) + 1
        if used > OFFSET_GROUPS_SHOWN_BYTES:
            break
        out.append(name)
    return out
