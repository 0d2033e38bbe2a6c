"""S17, membership changes under faults (issue 19, item 6): a 3-node group with spare nodes
grows and shrinks, one node at a time, while members are killed and isolated.

Every few seconds the schedule asks the group's leader for a change, as an operator would with
``dledger group``: a spare (or a node removed earlier, with whatever its disk holds) is started
and added (a learner, promoted once it has caught up), or a voter is removed (leadership moved
off it first if it leads; the first members go first, as old machines being replaced); the
group keeps 3 to 5 voters. A removed node is left running, as by an operator who has not got to
it yet: the leader no longer replicates to it, so it may never learn that it was removed, and it
must not be able to take part in the group again. Between changes a random node (a removed one
too) is killed (-9, restarted a few seconds later) or isolated; or, in ``AIMED_SHARE`` of them
when the group is in that shape, the case a member's memory of the changes exists for: while a
removed first member still runs, a first member (whose command line names the first three
voters) is restarted and then the leader is killed, so that the restarted node may campaign and
must count the voters its log holds. A change the group
refuses (one at a time, a learner not caught up, no leader reachable) is recorded and the
schedule carries on. The usual checkers judge the run (every acknowledged send present, one
leader per term, committed entries never change); the runner drains the members of the final
membership only.

The canary ``membership_forget_on_restart`` makes a restarted node forget the membership
changes its log holds: it counts the initial three voters again, so its leader commits on a
majority of the wrong group (acknowledged sends lost) or wins a term another leader holds.
"""

from __future__ import annotations

from typing import Any

from protocol import broker_kinds as bp
from protocol.errors import DLedgerError

__all__ = ["s17_membership"]

STEP_TIMEOUT_S = 10.0
AIMED_SHARE = 0.4  # of the faults: a first member restarted, then the leader killed (see above)


async def _leader_status(c: Any) -> tuple[str, dict[str, Any]] | None:
    leader = await c.leader()
    if leader is None:
        return None
    try:
        return leader, await c.control.call(leader, bp.BROKER_STATUS, timeout_s=2.0)
    except DLedgerError:
        return None


async def _ask(c: Any, kind: int, *args: Any) -> bool:
    """One request to the leader; a refusal or a timeout is recorded, not raised."""
    try:
        await c.control.call_leader(kind, *args, timeout_s=STEP_TIMEOUT_S + 2.0)
        return True
    except DLedgerError as err:
        c.history.add(proc="nemesis", type="info", f="refused", fault="membership",
                      nodes=[str(args[0])], error=str(err)[:200])
        return False


async def _grow(c: Any, voters: list[str]) -> None:
    cluster = c.cluster
    outside = [n for n in cluster.node_ids if n not in voters and n not in cluster.members]
    if not outside:
        return
    nid = c.rng.choice(outside)
    if not cluster.running(nid):
        await c.restart(nid)
    host, port = cluster.brokers.servers[nid].peer_address
    c.start("add-node", [nid])
    ms = int(STEP_TIMEOUT_S * 1000)
    if await _ask(c, bp.MEMBER_ADD, nid, f"{host}:{port}", ms):
        cluster.members.add(nid)
        await _ask(c, bp.MEMBER_PROMOTE, nid, ms)
    c.stop("add-node", [nid])


async def _shrink(c: Any, leader: str, voters: list[str], followers: list[str]) -> None:
    cluster = c.cluster
    first = [v for v in voters if v in cluster.brokers.members()]
    nid = c.rng.choice(first if first and c.rng.random() < 0.8 else voters)
    c.start("remove-node", [nid])
    if nid == leader:  # leadership leaves it first (as `dledger group remove-node` does)
        others = [v for v in voters if v != nid and v in followers]
        if others:
            await _ask(c, bp.TRANSFER_LEADERSHIP, c.rng.choice(others))
    if await _ask(c, bp.MEMBER_REMOVE, nid, int(STEP_TIMEOUT_S * 1000)):
        cluster.members.discard(nid)  # (left running)
    c.stop("remove-node", [nid])


async def _kill(c: Any, nid: str, down_s: float) -> None:
    """``nid`` killed (-9) and started again ``down_s`` later."""
    await c.do(c.cluster.kill, nid)
    c.start("kill", [nid])
    await c.sleep(down_s)
    await c.restart(nid)
    c.stop("kill", [nid])


async def _aimed(c: Any) -> bool:
    """A first member restarted while a removed first member still runs, then the leader
    killed; False (nothing done) when the group is not in that shape."""
    cluster = c.cluster
    first = set(cluster.brokers.members())
    if not any(n in first and n not in cluster.members and cluster.running(n)
               for n in cluster.node_ids):
        return False
    leader = await c.leader()
    members = [n for n in cluster.node_ids
               if n in first and n in cluster.members and n != leader and cluster.running(n)]
    if leader is None or not members:
        return False
    await _kill(c, c.rng.choice(members), c.rng.uniform(1, 2))
    if cluster.running(leader):
        await _kill(c, leader, c.rng.uniform(1, 3))
    return True


async def _fault(c: Any) -> None:
    cluster = c.cluster
    if c.rng.random() < AIMED_SHARE and await _aimed(c):
        return
    running = [n for n in cluster.node_ids if cluster.running(n)]
    if not running:
        return
    nid = c.rng.choice(running)
    if c.rng.random() < 0.6:
        await _kill(c, nid, c.rng.uniform(1, 3))
    else:
        links = await c.do(cluster.isolate, [nid])
        c.start("isolate", [nid])
        await c.sleep(c.rng.uniform(2, 5))
        await c.do(cluster.heal, links)
        c.stop("isolate", [nid])


async def s17_membership(c: Any) -> None:
    """(see the module docstring)"""
    while await c.sleep(c.rng.uniform(1, 3)):
        found = await _leader_status(c)
        if found is not None:
            leader, st = found
            m = st["membership"]
            voters, learners = list(m["voters"]), list(m["learners"])
            followers = [f["node_id"] for f in st["raft"]["followers"]]
            if learners:  # a change left half done: finish it
                await _ask(c, bp.MEMBER_PROMOTE, learners[0], int(STEP_TIMEOUT_S * 1000))
            elif len(voters) < 5 and (len(voters) <= 3 or c.rng.random() < 0.5):
                await _grow(c, voters)
            elif len(voters) > 3:
                await _shrink(c, leader, voters, followers)
        if await c.sleep(c.rng.uniform(1, 3)):
            await _fault(c)
