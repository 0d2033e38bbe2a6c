"""The log entries of transactions (``broker.features.txn.model``), strictly decoded:
TXN_END (kind 9) ``[ts, producer group, txn id, decision, [half offset...], [[topic, queue id,
message]...], [[group, topic, queue id, expected, new]...], check max, from check, auto create,
default queues]`` and TXN_CHECK (kind 10) ``[ts, [[txn id, checks]...]]``. Half messages
themselves are stored by ordinary sends to the half topic (the leader's rewrite)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.core.codec import as_bool, as_int, as_str, check_message, dump

__all__ = ["KIND_TXN_CHECK", "KIND_TXN_END", "TxnCheck", "TxnEnd", "decode_txn_check",
           "decode_txn_end", "encode_txn_check", "encode_txn_end", "txn_end_messages"]

KIND_TXN_END = 9
KIND_TXN_CHECK = 10


@dataclass(frozen=True, slots=True)
class TxnEnd:
    """The end of a transaction (``broker.features.txn.model``): ``decision`` COMMIT or ROLLBACK
    of every half message in ``halves`` (half-queue offsets, as the leader read the open
    transaction). A commit carries one ``[topic, queue id, message]`` copy per half for its real
    queue, and the consumer offsets to set with it (``[group, topic, queue id, expected, new]``:
    set only if the group's offset is ``expected``, -1 for none; if one is not, the transaction
    rolls back instead). A rollback after the last check-back (``check_max``) carries the copies
    for the check-max topic; another carries none."""

    store_ts_ms: int
    producer_group: str
    txn_id: str
    decision: str
    halves: tuple[int, ...]
    items: tuple[tuple[str, int, list[Any]], ...] = ()
    offsets: tuple[tuple[str, str, int, int, int], ...] = ()
    check_max: bool = False
    from_check: bool = False
    auto_create: bool = False
    default_queues: int = 4


@dataclass(frozen=True, slots=True)
class TxnCheck:
    """The leader's check-backs of open transactions: ``(txn id, its check count after this
    one)``, each counted once at apply."""

    store_ts_ms: int
    checks: tuple[tuple[str, int], ...]


def encode_txn_end(e: TxnEnd) -> bytes:
    return dump(KIND_TXN_END, [e.store_ts_ms, e.producer_group, e.txn_id, e.decision,
                               list(e.halves), [list(i) for i in e.items],
                               [list(o) for o in e.offsets], e.check_max, e.from_check,
                               e.auto_create, e.default_queues])


def encode_txn_check(e: TxnCheck) -> bytes:
    return dump(KIND_TXN_CHECK, [e.store_ts_ms, [list(c) for c in e.checks]])


def decode_txn_end(number: int, f: list[Any]) -> TxnEnd:
    ts, group, txn_id, decision, halves, items, offsets, check_max, from_check, auto, queues = f
    if decision not in ("COMMIT", "ROLLBACK"):
        raise ValueError(f"a transaction ends in COMMIT or ROLLBACK, not {decision!r}")
    if not isinstance(halves, list) or (not halves and (decision != "COMMIT" or not offsets)):
        raise ValueError("a transaction's end names its half messages (only a commit of "
                         "consumer offsets alone names none)")
    if not isinstance(items, list) or not isinstance(offsets, list):
        raise ValueError("a transaction's copies and offsets are lists")
    out_items = []
    for item in items:
        if type(item) is not list or len(item) != 3:
            raise ValueError("a committed copy is [topic, queue id, message]")
        check_message(item[2])
        out_items.append((as_str(item[0]), as_int(item[1]), item[2]))
    if out_items and len(out_items) != len(halves):
        raise ValueError("a transaction's end carries one copy per half message, or none")
    out_offsets = []
    for o in offsets:
        if type(o) is not list or len(o) != 5:
            raise ValueError("an offset is [group, topic, queue id, expected, new]")
        out_offsets.append((as_str(o[0]), as_str(o[1]), as_int(o[2]), as_int(o[3], -1),
                            as_int(o[4])))
    return TxnEnd(as_int(ts), as_str(group), as_str(txn_id), decision,
                  tuple(as_int(h) for h in halves), tuple(out_items), tuple(out_offsets),
                  as_bool(check_max), as_bool(from_check), as_bool(auto), as_int(queues, 1))


def decode_txn_check(number: int, f: list[Any]) -> TxnCheck:
    ts, checks = f
    if not isinstance(checks, list) or not checks:
        raise ValueError("a check entry names at least one transaction")
    out = []
    for c in checks:
        if type(c) is not list or len(c) != 2:
            raise ValueError("a check is [txn id, checks]")
        out.append((as_str(c[0]), as_int(c[1], 1)))
    return TxnCheck(as_int(ts), tuple(out))


def txn_end_messages(f: list[Any]) -> list[Any]:
    """A stored transaction end's message copies by slot, from its fields."""
    return [item[2] for item in f[5]]
