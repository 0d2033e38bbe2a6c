"""A change asked of a leader that has not yet committed an entry of its term (just elected, or
handed leadership by a transfer, as ``dledger group remove-node`` does to a leading node) waits
for that commit, within the change's deadline, instead of being refused; a node that is not the
leader goes on at once, to be answered NOT_LEADER by the core. (A live run once had the CLI's
remove-node refused "this leader has not committed an entry of its term yet" right after its
transfer.)"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from dledger.membership.shell import MembershipShell
from dledger.raft.types import Role
from protocol.errors import ProposalTimeoutError


class Shell(MembershipShell):
    def __init__(self, core: SimpleNamespace) -> None:  # (only what the wait reads)
        self.core = core  # type: ignore[assignment]


def leader(commit_index: int, term_start_index: int) -> SimpleNamespace:
    return SimpleNamespace(role=Role.LEADER, term_start_index=term_start_index,
                           log=SimpleNamespace(commit_index=commit_index))


def test_a_new_leader_takes_the_change_once_its_term_entry_commits() -> None:
    core = leader(commit_index=9, term_start_index=10)
    shell = Shell(core)

    async def run() -> None:
        waiting = asyncio.create_task(shell._until_term_committed(time.monotonic() + 30))
        for _ in range(3):  # (loop turns, not time: the task runs its first poll and sleeps)
            await asyncio.sleep(0)
        assert not waiting.done()
        core.log.commit_index = 10
        await asyncio.wait_for(waiting, timeout=10)
    asyncio.run(run())


def test_a_leader_whose_term_entry_never_commits_gives_up_at_the_deadline() -> None:
    shell = Shell(leader(commit_index=9, term_start_index=10))
    with pytest.raises(ProposalTimeoutError, match="entry of its term"):
        asyncio.run(shell._until_term_committed(time.monotonic() + 0.2))


def test_a_follower_or_a_leader_with_its_term_committed_goes_on_at_once() -> None:
    follower = SimpleNamespace(role=Role.FOLLOWER, term_start_index=0,
                               log=SimpleNamespace(commit_index=0))
    for core in (follower, leader(commit_index=10, term_start_index=10)):
        asyncio.run(asyncio.wait_for(Shell(core)._until_term_committed(time.monotonic()), 10))
