"""Scenario S21's schedule, lost answers: the leader's answers to the clients are swallowed for
``LOST_S`` every few seconds while it hears and replicates everything. A send it stores in the
window stays unanswered; the producer's attempt times out (1 s) and the library sends it again
with the same unique key until an answer comes: the scenario's send deadline (8 s) outlasts the
3 s for which the client leaves a leader that let a request time out (``SILENT_GRACE_S``), so
each such send is answered. Each message must be stored once: the broker's dedup table answers
the retry with the original's result. A second copy of an acknowledged value is a protocol
duplicate (``chaos.live.checkers.safety``); the canary ``dedup_ignored`` makes one."""

from __future__ import annotations

from typing import Any

FAULT = "lost-answers"
LOST_S = 1.5  # past the producer's 1 s attempt


async def s21_lost_answers(c: Any) -> None:
    """``c``: the schedule's ``chaos.live.nemesis.Ctl``."""
    while await c.sleep(c.rng.uniform(2, 4)):
        leader = await c.leader()
        if leader is None:
            continue
        links = [("c", leader)]  # the clients dial it: swallow what it answers
        await c.do(c.cluster.cut, links, ("downstream",))
        c.start(FAULT, [leader])
        await c.sleep(LOST_S)
        await c.do(c.cluster.heal, links)
        c.stop(FAULT, [leader])
