"""Transactional messages, the pure part: the leader's rewrite of a half message, and the table of
open transactions and recent decisions that the state machine keeps (RocketMQ's two-phase
"half" messages, with the op-half topic replaced by log entries).

A transactional send is stored as a *half message* in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0, with
its real topic and queue, its producer group and its transaction id as properties (RocketMQ's
``REAL_TOPIC``, ``REAL_QID``, ``PGROUP``, ``__transactionId__``, ``TRAN_MSG``); no consumer can
read that topic. Applying it opens (or extends) the transaction in a ``TxnTable``. A transaction
ends by one ``TxnEnd`` entry: COMMIT carries a copy of every half message for its real queue (so
they become visible at once, in the entry's order, and the consumer offsets it carries are set
in the same apply: the exactly-once pipeline's atomic step); ROLLBACK carries none. The table
remembers the last ``DECISIONS_KEPT`` decisions, so an END retried across a leader change
answers as the first one did, and a COMMIT and a ROLLBACK of one transaction never both take
effect: whichever entry the log orders first decides. ``TxnCheck`` entries count the leader's
check-backs (``broker.features.txn.service``), so a new leader carries on where the old one stopped.

Memory: an open transaction is a small list (about 200 bytes plus its id); the leader refuses new
ones past ``OPEN_MAX``. A decision kept is about 120 bytes. Pure and deterministic.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from protocol.int_property import natural
from protocol.topics import HALF_TOPIC

HALF_QUEUE = 0
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"  # half messages rolled back after max checks
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
PGROUP = "PGROUP"
TRANSACTION_ID = "__transactionId__"
TRAN_MSG = "TRAN_MSG"
HALF_PROPERTIES = (REAL_TOPIC, REAL_QID, PGROUP, TRANSACTION_ID)
TXN_ID_MAX_CHARS = 128
HALVES_MAX = 1024  # half messages in one transaction
OPEN_MAX = 100_000  # open transactions a leader takes (beyond: a named refusal)
DECISIONS_KEPT = 65_536
# Seeded bugs (tests only): "txn_half_visible" stores a half message in its real queue too
# (the apply); "txn_forget" makes a new leader forget the open transactions (the service).
TXN_CANARIES = frozenset({"txn_half_visible", "txn_forget"})

COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"


class TxnError(ValueError):
    """A half message the broker cannot take (malformed, delayed, ...)."""


@dataclass(slots=True)
class OpenTxn:
    producer_group: str
    halves: list[int]  # offsets in the half queue, in the order they were stored
    begun_ms: int  # store time of its first half message
    checks: int = 0  # check-backs the leaders made (TxnCheck entries)
    checked_ms: int = 0  # store time of the last TxnCheck

    def row(self, txn_id: str) -> list[Any]:
        return [txn_id, self.producer_group, list(self.halves), self.begun_ms, self.checks,
                self.checked_ms]


def half_message(m: list[Any], topic: str, queue_id: int, producer_group: str,
                 txn_id: str) -> list[Any]:
    """A message (entry form) rewritten as a half message: real topic, queue, producer group and
    transaction id as properties; the user's other properties kept."""
    body, tags, keys, unique_key, props, born = m
    kept = [p for p in props if p[0] not in (*HALF_PROPERTIES, TRAN_MSG)]
    return [body, tags, keys, unique_key,
            [*kept, [TRAN_MSG, "true"], [REAL_TOPIC, topic], [REAL_QID, str(queue_id)],
             [PGROUP, producer_group], [TRANSACTION_ID, txn_id]], born]


def half_of(m: list[Any]) -> tuple[str, int, str, str]:
    """(real topic, real queue id, producer group, transaction id) of a stored half message;
    ValueError if it lacks one."""
    props = dict(tuple(p) for p in m[4])
    try:
        qid = natural(props[REAL_QID], 6)
        if qid is None:
            raise ValueError(f"REAL_QID {props[REAL_QID]!r} is not a queue id")
        txn_id = props[TRANSACTION_ID]
        if not 0 < len(txn_id) <= TXN_ID_MAX_CHARS:
            raise ValueError("a transaction id has 1..128 characters")
        return props[REAL_TOPIC], qid, props[PGROUP], txn_id
    except KeyError as err:
        raise ValueError(f"a half message without {err}") from err


def committed_message(m: list[Any]) -> list[Any]:
    """A half message's copy for its real queue: the broker's routing properties dropped,
    ``TRAN_MSG`` and the transaction id kept (RocketMQ's consumers see them too)."""
    body, tags, keys, unique_key, props, born = m
    kept = [list(p) for p in props if p[0] not in (REAL_TOPIC, REAL_QID, PGROUP)]
    return [body, tags, keys, unique_key, kept, born]


class TxnTable:
    """Open transactions by id, and the latest decisions (id -> COMMIT/ROLLBACK), oldest first."""

    __slots__ = ("open", "decided")

    def __init__(self) -> None:
        self.open: dict[str, OpenTxn] = {}
        self.decided: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self.open)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TxnTable) and self.snapshot() == other.snapshot()

    def add_half(self, txn_id: str, producer_group: str, offset: int, ts_ms: int) -> None:
        txn = self.open.get(txn_id)
        if txn is None:
            self.open[txn_id] = OpenTxn(producer_group, [offset], ts_ms)
        else:
            txn.halves.append(offset)

    def open_empty(self, txn_id: str, producer_group: str, ts_ms: int) -> OpenTxn:
        """A transaction with no half message (ended by the same entry: offsets only)."""
        txn = self.open[txn_id] = OpenTxn(producer_group, [], ts_ms)
        return txn

    def refusal(self, txn_id: str, producer_group: str) -> str | None:
        """Why a new half message of ``txn_id`` cannot join it (None: it can)."""
        if txn_id in self.decided:
            return "TXN_ALREADY_DECIDED"
        txn = self.open.get(txn_id)
        if txn is not None and txn.producer_group != producer_group:
            return "TXN_NOT_FOUND"  # another producer group's transaction of that id
        if txn is not None and len(txn.halves) >= HALVES_MAX:
            return "TXN_TOO_LARGE"
        return None

    def decide(self, txn_id: str, decision: str) -> OpenTxn:
        txn = self.open.pop(txn_id)
        self.decided[txn_id] = decision
        while len(self.decided) > DECISIONS_KEPT:
            self.decided.popitem(last=False)
        return txn

    def count_check(self, txn_id: str, checks: int, ts_ms: int) -> bool:
        """The ``checks``-th check-back of ``txn_id`` (counted once, however often proposed)."""
        txn = self.open.get(txn_id)
        if txn is None or txn.checks != checks - 1:
            return False
        txn.checks = checks
        txn.checked_ms = ts_ms
        return True

    def snapshot(self) -> list[Any]:
        return [sorted(t.row(i) for i, t in self.open.items()),
                [[i, d] for i, d in self.decided.items()]]

    @classmethod
    def restore(cls, blob: Any) -> TxnTable:
        table = cls()
        rows, decided = blob
        for txn_id, group, halves, begun, checks, checked in rows:
            if not (isinstance(txn_id, str) and isinstance(group, str)
                    and isinstance(halves, list) and all(type(h) is int for h in halves)
                    and type(begun) is int and type(checks) is int and type(checked) is int):
                raise ValueError("malformed open transaction")
            table.open[txn_id] = OpenTxn(group, halves, begun, checks, checked)
        for txn_id, decision in decided:
            if not isinstance(txn_id, str) or decision not in (COMMIT, ROLLBACK):
                raise ValueError("malformed transaction decision")
            table.decided[txn_id] = decision
        return table


__all__ = [
    "CHECK_MAX_TOPIC",
    "COMMIT",
    "HALF_QUEUE",
    "HALF_TOPIC",
    "ROLLBACK",
    "OpenTxn",
    "TxnError",
    "TxnTable",
    "committed_message",
    "half_message",
    "half_of",
]
