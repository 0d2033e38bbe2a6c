"""The retry and dead-letter checker: reads a recorded history of a push consumer group whose
listener fails chosen messages a chosen number of times, and the group's dead-letter queue at the
end, and names each violation.

The plan of message *i* is how many of its deliveries fail: 0, 1, 2 ... or ``ALWAYS``. The
listener decides by *copy*: each stored copy of a message (the original, then each retry the
broker stores after a failure) is one attempt, identified by where it is stored (queue and
offset), and copy *k* (the *k*-th distinct copy delivered, from 0) fails iff k < plan. A copy
delivered again (at least once: after a failover or a hand-over the offset may not have been
committed) is the same attempt, given the same answer, and any number of such redeliveries is
allowed. The rules checked, per message:

- count: copy *k* carries ``RECONSUME_TIME`` == k: the broker's count is one per failure,
  carried across leader changes (the count lives in the replicated message);
- attempts: a message planned to fail f times has exactly f + 1 copies, the last one consumed
  successfully (no copy after the success, none missing); an always-failing one has exactly
  ``max_reconsume_times`` + 1 copies (the original and ``max_reconsume_times`` reconsumes);
- dead letter: an always-failing message is in ``%DLQ%<group>`` exactly once, with
  ``RECONSUME_TIME`` == ``max_reconsume_times``, its msg id (``UNIQ_KEY``) and
  ``ORIGIN_MESSAGE_ID`` (the original's offset message id) kept; no other message is there;
- lost: an acknowledged message neither consumed successfully (finite plan) nor dead-lettered
  (always) by the end.

Pure: the caller records and reads the cluster; this only judges. Used by the live chaos suite
with the canary ``retry_count_lost`` (a leader's count of its own, forgotten at a leader change)
that must make it fire.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

ALWAYS = -1  # a plan: every delivery fails


@dataclass(frozen=True, slots=True)
class RetrySent:
    msg_id: str
    plan: int  # failures planned (ALWAYS: all)
    offset_msg_id: str  # the original's, which its dead letter must keep as ORIGIN_MESSAGE_ID


@dataclass(frozen=True, slots=True)
class RetryDelivery:
    msg_id: str
    copy: str  # where this copy is stored: "<topic>/<group>/<queue id>@<offset>"
    reconsume_times: int  # RECONSUME_TIME as delivered
    ok: bool  # the listener's answer
    t: float  # when it was delivered (one host's clock)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    msg_id: str
    offset: int  # in the dead-letter queue
    reconsume_times: int
    origin_message_id: str  # "" if missing


def fails(copy_index: int, plan: int) -> bool:
    """The listener's rule: copy ``copy_index`` (from 0) of a message with ``plan`` fails."""
    return plan == ALWAYS or copy_index < plan


def check_retries(sent: dict[str, RetrySent], deliveries: Iterable[RetryDelivery],
                  dead: Iterable[DeadLetter], max_reconsume_times: int) -> list[str]:
    """Violations, by message id; ``sent`` holds the acknowledged messages."""
    copies: dict[str, dict[str, RetryDelivery]] = defaultdict(dict)  # first delivery of each
    succeeded: dict[str, set[str]] = defaultdict(set)
    for d in sorted(deliveries, key=lambda d: d.t):
        copies[d.msg_id].setdefault(d.copy, d)
        if d.ok:
            succeeded[d.msg_id].add(d.copy)
    letters: dict[str, list[DeadLetter]] = defaultdict(list)
    for letter in dead:
        letters[letter.msg_id].append(letter)
    problems: list[str] = []
    for msg_id, first in sorted(copies.items()):
        problems += _chain(msg_id, list(first.values()))
    for msg_id, s in sorted(sent.items()):
        chain = list(copies.get(msg_id, {}).values())
        if s.plan == ALWAYS:
            problems += _dead_lettered(s, chain, letters.get(msg_id, []), max_reconsume_times)
        else:
            problems += _consumed(s, chain, succeeded[msg_id], letters.get(msg_id, []))
    for msg_id, found in sorted(letters.items()):
        if msg_id not in sent and msg_id not in copies:
            problems.append(f"dead letter: {msg_id} in the dead-letter queue at offset "
                            f"{found[0].offset} is no message the group consumed")
    return problems


def _chain(msg_id: str, chain: list[RetryDelivery]) -> list[str]:
    """Copy k carries RECONSUME_TIME k."""
    counts = [d.reconsume_times for d in chain]
    if counts != list(range(len(chain))):
        return [f"count: {msg_id}'s copies carry reconsume times {counts}, not "
                f"{list(range(len(chain)))} ({', '.join(d.copy for d in chain)})"]
    return []


def _consumed(s: RetrySent, chain: list[RetryDelivery], ok_copies: set[str],
              letters: list[DeadLetter]) -> list[str]:
    problems = []
    if not ok_copies:
        return [f"lost: {s.msg_id} (planned {s.plan} failures) never consumed successfully "
                f"({len(chain)} copies delivered)"]
    if len(chain) != s.plan + 1:
        problems.append(f"attempts: {s.msg_id} planned {s.plan} failures had {len(chain)} "
                        f"copies, not {s.plan + 1}")
    if letters:
        problems.append(f"dead letter: {s.msg_id} (planned {s.plan} failures) is in the "
                        f"dead-letter queue {len(letters)} time(s)")
    return problems


def _dead_lettered(s: RetrySent, chain: list[RetryDelivery], letters: list[DeadLetter],
                   max_reconsume_times: int) -> list[str]:
    if not letters:
        return [f"lost: {s.msg_id} (always failing) not in the dead-letter queue "
                f"({len(chain)} copies delivered)"]
    problems = []
    if len(chain) != max_reconsume_times + 1:
        problems.append(f"attempts: {s.msg_id} dead-lettered after {len(chain)} failed copies, "
                        f"not {max_reconsume_times + 1} (max_reconsume_times "
                        f"{max_reconsume_times})")
    if len(letters) > 1:
        problems.append(f"dead letter: {s.msg_id} in the dead-letter queue {len(letters)} times "
                        f"(offsets {[d.offset for d in letters]})")
    for letter in letters:
        if letter.reconsume_times != max_reconsume_times:
            problems.append(f"dead letter: {s.msg_id} at offset {letter.offset} carries "
                            f"reconsume times {letter.reconsume_times}, not "
                            f"{max_reconsume_times}")
        if letter.origin_message_id != s.offset_msg_id:
            problems.append(f"dead letter: {s.msg_id} at offset {letter.offset} has "
                            f"ORIGIN_MESSAGE_ID {letter.origin_message_id!r}, not the "
                            f"original's {s.offset_msg_id!r}")
    return problems
