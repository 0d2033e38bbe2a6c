"""Scenario S21's schedule, lost answers: the leader's answers to the clients are swallowed for
``LOST_S`` every few seconds while it hears and replicates everything. A send it stores in the
window stays unanswered; the producer's attempt times out (1 s) and the library sends it again
with the same unique key: the client asks the followers, which still name that leader at its
term, and 2.5 s after the unanswered request takes that as proof that it leads
(``protocol.group_client.LEADS_PROOF_S``), so the send is answered within its default 3 s
deadline. Each message must be stored once: the broker's dedup table answers the retry with the
original's result. A second copy of an acknowledged value is a protocol
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
