"""The transaction service: the leader's side of transactional messages (``broker.features.txn.model``).

- ``half``: a TXN_HALF request's messages checked as any send's (a delayed one refused), rewritten
  as half messages and proposed as one entry of their own (so that a refused transaction fails
  only its own request);
- ``end``: an END_TRANSACTION, proposed as one ``TxnEnd`` entry with the half messages' copies
  read from the commitlog (the apply decides: a second END of the same decision answers OK, of
  the other TXN_ALREADY_DECIDED);
- the check-back loop, on the leader only once it has applied its own term's first entry: an
  open transaction with no end ``transaction_timeout_s`` after its first half message, and
  every ``check_interval_s`` after its last check, is counted (one ``TxnCheck`` entry) and then
  asked about on the connection of a live producer of its group (``ProducerConnection``: our
  protocol's CHECK_TRANSACTION frame or the remoting protocol's CHECK_TRANSACTION_STATE,
  server-initiated; the producer answers with an END_TRANSACTION); after ``check_max`` checks it
  is rolled back and its half messages stored in the check-max topic. Progress is replicated,
  so a new leader carries on from the checks counted; a check proposed twice counts once.

Resolution bound: an open transaction is decided within ``timeout + (check_max + 1) *
interval`` (plus a period of this loop) of its first half message while some leader serves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from broker.core.clients import ClientGroups
from broker.core.entries import encode_send
from broker.core.sendwire import check_entry_size, run_answers
from broker.features.delay.model import TIMER_PROPERTIES
from broker.features.host import BrokerHost
from broker.features.txn.entries import TxnCheck, TxnEnd
from broker.features.txn.model import (
    CHECK_MAX_TOPIC,
    COMMIT,
    HALF_QUEUE,
    HALF_TOPIC,
    OPEN_MAX,
    ROLLBACK,
    committed_message,
    half_message,
)
from protocol.broker_errors import BadTransactionError, BrokerError
from protocol.broker_kinds import SendRefusedError, offset_msg_id, unscoped
from protocol.errors import DLedgerError

log = logging.getLogger("broker.features.txn")

# Seeded bug (tests only): "txn_forget" makes a new leader forget the transactions open when it
# took over: it never checks them back, so an UNKNOWN one stays open for ever.
CHECK_PERIOD_S = 0.25
CHECKS_PER_ENTRY = 256  # transactions counted in one TxnCheck entry, at most
END_RETRIES = 3  # an END whose transaction changed under it (a half joined) is read again


class ProducerConnection(Protocol):
    """A producer's connection, as the check-back sees it (each front end's connection class):
    whether it is open, and how to ask it about a transaction (``messages``: its first half
    message as a pull row, its offset the half queue's)."""

    @property
    def alive(self) -> bool: ...

    def check_transaction(self, group: str, producer_group: str, txn_id: str, checks: int,
                          messages: list[list[Any]]) -> None: ...


class RunChecker(Protocol):
    def check_run(self, topic: Any, queue_id: Any, raw: Any,
                  batch: bool) -> tuple[list[list[Any]], int, bool]:
        """One run of a send checked as any send's (``broker.api.sendpath``)."""
        ...


class TxnHost(BrokerHost, Protocol):
    @property
    def sends(self) -> RunChecker: ...


class TxnService:
    def __init__(self, host: TxnHost) -> None:
        self.host = host
        self.producers: ClientGroups[ProducerConnection] = ClientGroups()
        self._task: asyncio.Task[None] | None = None
        self._term = -1
        self._forgotten: frozenset[str] = frozenset()
        self._forget = "txn_forget" in host.config.canaries
        self.checks_sent = 0  # check requests this node sent as leader (for status)
        self.unanswerable = 0  # checks due when no producer of the group was live here

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # -- requests -----------------------------------------------------------------------------

    async def half(self, producer_group: str, txn_id: str, topic: str, queue_id: int,
                   raw: Any) -> list[Any]:
        """TXN_HALF: SEND's answer; the queue offsets are those of the half queue."""
        host = self.host
        host.require_leader()
        txns = host.state.txns
        refusal = txns.refusal(txn_id, producer_group)
        if refusal is not None:
            raise SendRefusedError(refusal, txn_id)
        if txn_id not in txns.open and len(txns) >= OPEN_MAX:
            raise SendRefusedError("OVERLOADED", f"{len(txns)} transactions are open")
        messages, _, with_props = host.sends.check_run(topic, queue_id, raw, batch=True)
        if with_props and any(p[0] in TIMER_PROPERTIES for m in messages for p in m[4]):
            raise BadTransactionError("a transactional message cannot be delayed (RocketMQ's "
                                      "rule)")
        halves = [half_message(m, topic, queue_id, producer_group, txn_id) for m in messages]
        result = await host.commit(check_entry_size(encode_send(
            HALF_TOPIC, HALF_QUEUE, int(time.time() * 1000), halves, False, 1)))
        store = host.node.store
        assert store is not None
        (answer,) = run_answers(host.group, store.position_of(result.index), result)
        if answer[0] != "SEND_OK":
            raise SendRefusedError(answer[0], answer[1])
        return answer

    async def end(self, producer_group: str, txn_id: str, decision: str, from_check: bool,
                  offsets: list[tuple[str, str, int, int, int]]) -> list[Any]:
        """END_TRANSACTION -> ``[decision, [[topic, queue id, queue offset, offset msg id],
        ...]]`` (the committed copies; none for a rollback or a repeated END)."""
        host = self.host
        host.require_leader()
        await host.node.read_barrier()  # every earlier half message and end applied here
        for attempt in range(END_RETRIES):
            entry = self._end_entry(producer_group, txn_id, decision, from_check, offsets)
            if entry is None:
                return [decision, []]  # decided so already
            try:
                result = await host.leader_commit(entry)
            except SendRefusedError as err:
                if err.status == "TXN_CHANGED" and attempt + 1 < END_RETRIES:
                    continue
                raise
            store = host.node.store
            assert store is not None
            position = store.position_of(result.index)
            return [result.detail or decision,
                    [[r.topic, r.queue_id, r.queue_offsets[0],
                      offset_msg_id(host.group, position, r.first_slot)]
                     for r in result.runs if r.status == "SEND_OK"]]
        raise SendRefusedError("TXN_CHANGED", txn_id)

    def _end_entry(self, producer_group: str, txn_id: str, decision: str, from_check: bool,
                   offsets: list[tuple[str, str, int, int, int]], check_max: bool = False
                   ) -> TxnEnd | None:
        """The end entry for the transaction as this leader's state has it (None: it was
        decided so already); a named refusal if it is unknown or decided the other way."""
        txns = self.host.state.txns
        txn = txns.open.get(txn_id)
        config = self.host.config
        if txn is None and decision == COMMIT and offsets and txn_id not in txns.decided:
            return TxnEnd(int(time.time() * 1000), producer_group, txn_id, decision, (), (),
                          tuple(offsets), False, from_check, config.auto_create_topics,
                          config.default_queues)  # consumer offsets alone
        if txn is None or txn.producer_group != producer_group:
            prior = txns.decided.get(txn_id) if txn is None else None
            if prior == decision:
                return None
            if prior is not None:
                raise SendRefusedError("TXN_ALREADY_DECIDED", f"{txn_id} was {prior}")
            raise SendRefusedError("TXN_NOT_FOUND", f"no open transaction {txn_id} of "
                                   f"producer group {producer_group}")
        items: list[tuple[str, int, list[Any]]] = []
        if decision == COMMIT or check_max:
            for offset in txn.halves:
                m = self._half_message(offset)
                props = dict(tuple(p) for p in m[4])
                items.append((CHECK_MAX_TOPIC, 0, m) if check_max else
                             (props["REAL_TOPIC"], int(props["REAL_QID"]), committed_message(m)))
        return TxnEnd(int(time.time() * 1000), producer_group, txn_id, decision,
                      tuple(txn.halves), tuple(items), tuple(offsets), check_max, from_check,
                      config.auto_create_topics, config.default_queues)

    def _half_message(self, offset: int) -> list[Any]:
        try:
            unit = self.host.state.queues[(HALF_TOPIC, HALF_QUEUE)][offset]
            return self.host.stored_message(unit.position, unit.slot)
        except (DLedgerError, IndexError) as err:  # retention took it (docs/operations.md)
            raise SendRefusedError("TXN_UNREADABLE", f"half message at offset {offset} of "
                                   f"{HALF_TOPIC} is no longer in the log: {err}") from err

    def heartbeat(self, client_id: str, group: str, conn: ProducerConnection,
                  ttl_s: float) -> list[str]:
        return self.producers.heartbeat(client_id, group, conn, ttl_s, time.monotonic())

    # -- check-back -------------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(CHECK_PERIOD_S)  # the loop's period
            try:
                await self.check_due()
            except (DLedgerError, BrokerError) as err:
                log.warning("transaction check-back failed (will retry): %s", err)

    async def check_due(self) -> int:
        """One look: roll back the transactions past their last check, count and send the
        checks due. Returns how many transactions it acted on."""
        host = self.host
        core = host.node.core
        if core is None or not host.node.is_leader or not host.caught_up():
            return 0
        if core.term != self._term:  # a new term: the canary forgets what was open
            self._term = core.term
            self._forgotten = frozenset(host.state.txns.open) if self._forget else frozenset()
        config = host.config
        timeout_ms = int(config.transaction_timeout_s * 1000)
        interval_ms = int(config.transaction_check_interval_s * 1000)
        now_ms = time.time() * 1000
        to_check: list[tuple[str, int]] = []
        exhausted: list[str] = []
        for txn_id, txn in host.state.txns.open.items():
            if txn_id in self._forgotten:
                continue
            due_ms = txn.begun_ms + timeout_ms if txn.checks == 0 else txn.checked_ms + interval_ms
            if now_ms < due_ms:
                continue
            if txn.checks >= config.transaction_check_max:
                exhausted.append(txn_id)
            else:
                to_check.append((txn_id, txn.checks + 1))
            if len(to_check) + len(exhausted) >= CHECKS_PER_ENTRY:
                break
        for txn_id in exhausted:
            await self._roll_back_exhausted(txn_id)
        if to_check:
            await host.leader_commit(TxnCheck(int(time.time() * 1000), tuple(to_check)))
            for txn_id, _ in to_check:
                self._ask(txn_id)
        return len(to_check) + len(exhausted)

    async def _roll_back_exhausted(self, txn_id: str) -> None:
        txn = self.host.state.txns.open.get(txn_id)
        if txn is None:
            return
        try:
            entry = self._end_entry(txn.producer_group, txn_id, ROLLBACK, True, [],
                                    check_max=True)
        except SendRefusedError as err:
            if err.status != "TXN_UNREADABLE":
                raise
            log.error("transaction %s: %s; rolled back without a copy", txn_id, err.detail)
            entry = self._end_entry(txn.producer_group, txn_id, ROLLBACK, True, [])
        if entry is not None:
            log.warning("transaction %s of %s rolled back after %d checks", txn_id,
                        txn.producer_group, txn.checks)
            await self.host.leader_commit(entry)

    def _ask(self, txn_id: str) -> None:
        """Send a CHECK_TRANSACTION for ``txn_id`` to a live producer of its group, if any."""
        txn = self.host.state.txns.open.get(txn_id)
        if txn is None:
            return
        producer = self.producers.pick(txn.producer_group, time.monotonic())
        if producer is None or not producer.conn.alive:
            self.unanswerable += 1
            return
        messages = []
        for offset in txn.halves[:1]:  # the first half stands for its transaction (RocketMQ's)
            m = self._half_message(offset)  # (refused if retention took it)
            unit = self.host.state.queues[(HALF_TOPIC, HALF_QUEUE)][offset]
            messages.append([offset, *m[:3], unscoped(m[3]), *m[4:], unit.store_ts_ms,
                             offset_msg_id(self.host.group, unit.position, unit.slot)])
        try:
            producer.conn.check_transaction(self.host.group, txn.producer_group, txn_id,
                                            txn.checks, messages)
        except Exception as err:  # a front end's failure to ask: the loop must go on
            log.error("transaction %s: the check-back could not ask its producer: %r", txn_id,
                      err)
            self.unanswerable += 1
            return
        self.checks_sent += 1

    def status(self) -> dict[str, Any]:
        txns = self.host.state.txns
        return {"open": len(txns), "decided_kept": len(txns.decided),
                "checks_sent_here": self.checks_sent, "unanswerable_here": self.unanswerable,
                "producer_groups": self.producers.snapshot(time.monotonic())}


__all__ = ["TxnService"]
