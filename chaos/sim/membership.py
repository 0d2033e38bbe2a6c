"""Membership changes in the simulated world: spare nodes that start outside the group (as a node
started with ``--join``), and a leader asked now and then for a random single-server change: add
a spare as a learner, promote a learner, drop a learner, remove a voter (itself included). The
core refuses what its rules forbid (a change while one is pending, a learner not caught up);
refusals are counted, not errors. Removed nodes keep running, as a stopped-too-late server
would, and may be added again later with whatever their log holds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from chaos.sim.node import SimNode
from dledger.raft.types import Membership
from protocol.errors import ProposalError


class MembershipWorld(Protocol):
    """What membership changes use of the world (``chaos.sim.world.World``)."""

    @property
    def ids(self) -> list[str]: ...

    def count(self, kind: str) -> None: ...

    def event(self, text: str) -> None: ...

    def observe(self, node: SimNode | None = None) -> None: ...


@dataclass(frozen=True)
class MembershipSettings:
    """What a seed decides about membership (drawn from a generator of its own)."""

    spares: int  # nodes outside the group at the start
    change_rate: float  # per tick: the leader is asked for a change

    @staticmethod
    def draw(rng: random.Random) -> MembershipSettings:
        return MembershipSettings(spares=rng.choice((0, 1, 2, 2)),
                                  change_rate=rng.choice((0.0, 0.01, 0.03, 0.08)))


class MembershipShell:
    def __init__(self, world: MembershipWorld, settings: MembershipSettings, seed: int) -> None:
        self.world = world
        self.settings = settings
        self.rng = random.Random(f"members-{seed}")

    def maybe_change(self, leader: SimNode) -> None:
        if self.rng.random() >= self.settings.change_rate:
            return
        core = leader.core
        m = core.membership
        choices: list[tuple[str, str]] = []  # (as an operator would: a caught-up learner is
        outside = [x for x in self.world.ids if x not in m.members]  # promoted, mostly)
        if outside:
            choices.append(("add", self.rng.choice(outside)))
        if m.learners:
            ready = [x for x in m.learners if x in core.progress
                     and core.progress[x].match_index + 4 >= core.log.commit_index]
            choices += [("promote", self.rng.choice(ready or list(m.learners)))] * 3
            choices.append(("drop", self.rng.choice(m.learners)))
        if len(m.voters) > 2 or (len(m.voters) == 2 and self.rng.random() < 0.2):
            choices.append(("remove", self.rng.choice(m.voters)))
        if not choices:
            return
        kind, who = self.rng.choice(choices)
        new = _changed(m, kind, who)
        world = self.world
        try:
            leader.core.propose_membership(new)
        except (ProposalError, ValueError) as err:
            world.count("member_refused")
            world.event(f"{leader.id} refuses {kind} {who}: {err}")
            return
        world.count(f"member_{kind}")
        world.event(f"{leader.id} proposes {kind} {who}: voters {list(new.voters)} learners "
                    f"{list(new.learners)}")
        leader.drain()
        world.observe(leader)


def _changed(m: Membership, kind: str, who: str) -> Membership:
    voters, learners = list(m.voters), list(m.learners)
    if kind == "add":
        learners.append(who)
    elif kind == "promote":
        learners.remove(who)
        voters.append(who)
    elif kind == "drop":
        learners.remove(who)
    else:
        voters.remove(who)
    return Membership(tuple(sorted(voters)), tuple(sorted(learners)))
