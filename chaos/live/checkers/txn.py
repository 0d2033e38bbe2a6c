"""The transactional-message checker: reads what the transactional producers recorded (each send
and its plan, each decision a listener took, each END acknowledged), what two push consumer
groups were delivered, what the topic holds at the end and how many transactions the leader still
has open, and names each violation.

A send's *plan* is its local transaction, encoded in the message body so that any producer of
the group (a restarted one too) answers a check-back the same way (``PLANS``):

- ``commit`` / ``rollback``: the local transaction answers so at once;
- ``raise-commit``: the local transaction raises (UNKNOWN); a check-back answers COMMIT;
- ``unknown-rollback``: UNKNOWN; a check-back answers ROLLBACK;
- ``unknown-commit``: UNKNOWN; check-backs answer UNKNOWN until the body's due time, then COMMIT.

The rules checked, per send (by its id, which the body carries; a line starts with the rule):

- rolled back: a message of a rolling-back plan stored in the topic or consumed;
- early: a delivery before the first COMMIT decision recorded for its send (a half message
  visible before its commit), or of a send no one decided to commit;
- twice: a send stored more than once in the topic (one queue offset per transaction);
- id: a stored copy whose ``__transactionId__`` is not the one its half message was
  acknowledged with;
- lost: a committing plan whose half message was acknowledged (or whose COMMIT was) not in the
  topic by the end;
- unconsumed: a stored message some consumer group was never delivered (redeliveries of the
  stored copy are allowed and counted: the consumers are at least once);
- unexpected: a stored or delivered message no producer sent, or a delivery of a copy the topic
  does not hold;
- unresolved: transactions still open at the leader at the end, or resolved only after the
  bound (transaction timeout + (max checks + 1) * check interval, and a little slack).

Pure: the caller records and reads the cluster; this only judges.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

COMMIT, ROLLBACK, UNKNOWN = "COMMIT", "ROLLBACK", "UNKNOWN"
PLANS = ("commit", "rollback", "raise-commit", "unknown-rollback", "unknown-commit")
COMMITTING = frozenset({"commit", "raise-commit", "unknown-commit"})
SHOWN = 5  # ids named in one line


@dataclass(frozen=True, slots=True)
class TxnEvent:
    """One record of a producer: ``kind`` is ``invoke`` (a send begun, with its plan), ``half``
    (its half message acknowledged, with the transaction id), ``fail`` (not acknowledged),
    ``decide`` (a listener answered ``state`` COMMIT or ROLLBACK, at ``t``), ``end`` (the send's
    END of ``state`` acknowledged) or ``sent`` (the send returned)."""

    kind: str
    send_id: str
    t: float  # time.monotonic() (one host: comparable across its processes)
    plan: str = ""
    state: str = ""
    txn_id: str = ""
    producer: str = ""
    by: str = ""  # a decision's: "execute" or "check"


@dataclass(frozen=True, slots=True)
class TxnDelivery:
    group: str  # the consumer group
    send_id: str
    copy: str  # where the delivered message is stored: "<queue id>@<queue offset>"
    t: float


@dataclass(frozen=True, slots=True)
class TxnStored:
    send_id: str
    copy: str  # "<queue id>@<queue offset>"
    txn_id: str  # the copy's __transactionId__ ("" if missing)


@dataclass(frozen=True, slots=True)
class Resolution:
    """The end of the run: open transactions at the leader (-1: could not be read), the seconds
    after the producers stopped at which none was open (None: never), and the bound."""

    open_left: int
    resolved_in_s: float | None
    bound_s: float


@dataclass
class _Send:
    plan: str = ""
    halved: bool = False
    txn_id: str = ""
    end_commit: bool = False
    first_commit_t: float | None = None


def _sends(events: Iterable[TxnEvent]) -> dict[str, _Send]:
    sends: dict[str, _Send] = defaultdict(_Send)
    for e in events:
        s = sends[e.send_id]
        if e.kind == "invoke":
            s.plan = e.plan
        elif e.kind == "half":
            s.halved, s.txn_id = True, e.txn_id
        elif e.kind == "end" and e.state == COMMIT:
            s.end_commit = True
        elif e.kind == "decide" and e.state == COMMIT:
            s.first_commit_t = e.t if s.first_commit_t is None else min(s.first_commit_t, e.t)
    return dict(sends)


def _named(ids: Iterable[str]) -> str:
    got = sorted(ids)
    return ", ".join(got[:SHOWN]) + (f" and {len(got) - SHOWN} more" if len(got) > SHOWN else "")


def check_transactions(events: Iterable[TxnEvent], deliveries: Iterable[TxnDelivery],
                       stored: Iterable[TxnStored], groups: Iterable[str],
                       resolution: Resolution) -> list[str]:
    """Violations, one line per rule and send (``unresolved`` once)."""
    sends = _sends(events)
    copies: dict[str, set[str]] = defaultdict(set)
    ids: dict[str, set[str]] = defaultdict(set)  # send id -> its stored copies' transaction ids
    for st in stored:
        copies[st.send_id].add(st.copy)
        ids[st.send_id].add(st.txn_id)
    got: dict[str, list[TxnDelivery]] = defaultdict(list)
    for d in deliveries:
        got[d.send_id].append(d)
    problems: list[str] = []
    for send_id in sorted(set(copies) | set(got)):
        s = sends.get(send_id)
        if s is None or not s.plan:
            problems.append(f"unexpected: {send_id} stored at {_named(copies[send_id])} or "
                            f"consumed, but no producer sent it")
            continue
        problems += _visible(send_id, s, sorted(copies[send_id]), got[send_id])
        if s.txn_id and ids.get(send_id, {s.txn_id}) != {s.txn_id}:
            problems.append(f"id: {send_id} stored with transaction id(s) "
                            f"{sorted(ids[send_id])}, its half was acknowledged as {s.txn_id}")
    for send_id, s in sorted(sends.items()):
        if s.plan in COMMITTING and (s.halved or s.end_commit) and not copies.get(send_id):
            problems.append(f"lost: {send_id} ({s.plan}, half acknowledged"
                            f"{', COMMIT acknowledged' if s.end_commit else ''}) is not in the "
                            f"topic")
    for group in sorted(groups):
        seen = {d.send_id for ds in got.values() for d in ds if d.group == group}
        for send_id in sorted(set(copies) - seen):
            if sends.get(send_id, _Send()).plan in COMMITTING:
                problems.append(f"unconsumed: {send_id} stored at {_named(copies[send_id])} "
                                f"was never delivered to {group}")
    problems += _unresolved(resolution)
    return problems


def _visible(send_id: str, s: _Send, where: list[str], deliveries: list[TxnDelivery]
             ) -> list[str]:
    """The rules on one send that is in the topic or was consumed."""
    if s.plan not in COMMITTING:
        by = sorted({d.group for d in deliveries})
        return [f"rolled back: {send_id} ({s.plan}) stored at {_named(where) or 'no offset'}"
                f"{', consumed by ' + ', '.join(by) if by else ''}"]
    problems = []
    if len(where) > 1:
        problems.append(f"twice: {send_id} stored {len(where)} times ({_named(where)})")
    early = [d for d in deliveries if s.first_commit_t is None or d.t < s.first_commit_t]
    if early:
        first = min(early, key=lambda d: d.t)
        when = ("no COMMIT was decided" if s.first_commit_t is None else
                f"{(s.first_commit_t - first.t) * 1000:.0f} ms before its COMMIT was decided")
        problems.append(f"early: {send_id} ({s.plan}) delivered to {first.group} at "
                        f"{first.copy}, {when} ({len(early)} early deliveries)")
    stray = sorted({d.copy for d in deliveries} - set(where))
    if stray:
        problems.append(f"unexpected: {send_id} delivered at {_named(stray)}, which the topic "
                        f"does not hold")
    return problems


def _unresolved(r: Resolution) -> list[str]:
    if r.open_left < 0:
        return ["unresolved: the leader's open transactions could not be read"]
    if r.open_left > 0:
        return [f"unresolved: {r.open_left} transaction(s) still open at the leader at the end "
                f"(bound {r.bound_s:g} s after the producers stopped)"]
    if r.resolved_in_s is None or r.resolved_in_s > r.bound_s:
        return [f"unresolved: the open transactions were resolved only {r.resolved_in_s} s "
                f"after the producers stopped (bound {r.bound_s:g} s)"]
    return []


def redeliveries(deliveries: Iterable[TxnDelivery]) -> dict[str, int]:
    """Per consumer group, deliveries beyond the first of each stored copy (at least once)."""
    seen: set[tuple[str, str]] = set()
    extra: dict[str, int] = defaultdict(int)
    for d in deliveries:
        key = (d.group, d.copy)
        if key in seen:
            extra[d.group] += 1
        else:
            seen.add(key)
            extra.setdefault(d.group, 0)
    return dict(extra)


__all__ = [
    "COMMIT",
    "COMMITTING",
    "PLANS",
    "ROLLBACK",
    "UNKNOWN",
    "Resolution",
    "TxnDelivery",
    "TxnEvent",
    "TxnStored",
    "check_transactions",
    "redeliveries",
]
