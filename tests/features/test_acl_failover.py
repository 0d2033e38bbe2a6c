"""Access control across a leader kill, judged by the live ACL checker (``chaos.live.checkers.acl``):
an admin revokes and grants an account's PUB on a topic while the account keeps sending, and the
leader is SIGKILLed with PUB granted. Every send that began after a change was acknowledged must
be decided by that change, on the new leader too. The canary ``acl_local_only`` (ACL changes
made on the leader's table, not through the log) is caught: the new leader never learnt them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from broker.features.acl.model import DENY, PUB, Account
from chaos.live.checkers.acl import AclVerdict, PermChange, SendAttempt, check_acl
from client import AccessDeniedError, ClientError, Credentials, Message, Producer, SignatureError
from client.cluster.routes import Routes
from dledger.localcluster import LocalCluster
from protocol import broker_kinds as bp
from tests.clusters import namesrv_group, registered_group
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow

ROOT = Credentials("root", "root-secret-1")
ALICE = Credentials("alice", "alice-secret-1")


async def _history(ns: str, cluster: LocalCluster) -> AclVerdict:
    changes: list[PermChange] = []
    sends: list[SendAttempt] = []
    stop = asyncio.Event()
    routes = Routes(ns, credentials=ROOT)
    await routes.start()
    g = await registered_group(routes)
    client = routes.group_client(g)

    async def change(pub: bool) -> None:
        began = time.monotonic()
        account = Account(ALICE.access_key, ALICE.secret_key,
                          topic_perms=(("orders", PUB if pub else DENY),))
        await client.call_leader(bp.ACL_PUT, account.row(), timeout_s=20)
        changes.append(PermChange(began, time.monotonic(), pub))

    async def sender() -> None:
        async with Producer(ns, send_timeout_s=5, credentials=ALICE) as p:
            while not stop.is_set():
                began = time.monotonic()
                try:
                    await p.send(Message("orders", b"x"))
                    outcome = "ok"
                except (AccessDeniedError, SignatureError):
                    outcome = "denied"
                except ClientError:
                    outcome = "failed"
                sends.append(SendAttempt(began, time.monotonic(), outcome))

    async def judged_after(t: float, count: int) -> None:
        def decided() -> bool:
            assert not task.done(), task  # the sender ended early: its error says why
            return sum(1 for s in sends if s.began_s > t and s.outcome != "failed") >= count
        await wait_until(decided, 30, f"{count} decided sends")

    try:
        async with Producer(ns, credentials=ROOT) as root:
            await root.send(Message("orders", b"seed"))
        await change(False)
        task = asyncio.create_task(sender())
        await judged_after(changes[-1].acked_s, 20)
        await change(True)
        await judged_after(changes[-1].acked_s, 20)
        leader, _ = await client.call_leader(bp.BROKER_STATUS)
        killed_s = time.monotonic()
        cluster.kill(leader)
        await judged_after(killed_s, 50)
        await change(False)
        await judged_after(changes[-1].acked_s, 20)
        stop.set()
        await asyncio.wait_for(task, 30)
    finally:
        stop.set()
        await routes.close()
    return check_acl(changes, sends)


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> AclVerdict:
    monkeypatch.setenv("DLEDGER_ACL_SECRET_ROOT", ROOT.secret_key)
    monkeypatch.setenv("DLEDGER_ACCESS_KEY", ROOT.access_key)  # the group's routing warm-up
    monkeypatch.setenv("DLEDGER_SECRET_KEY", ROOT.secret_key)
    with namesrv_group(tmp_path, "--acl", "--acl-admin-key", "root", *extra) as (ns, cluster):
        monkeypatch.delenv("DLEDGER_ACCESS_KEY")
        monkeypatch.delenv("DLEDGER_SECRET_KEY")
        return asyncio.run(_history(ns, cluster))


def test_acl_changes_hold_across_a_leader_kill(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    verdict = _run(tmp_path, monkeypatch)
    assert verdict.ok, verdict.lines()
    assert verdict.judged >= 110


def test_the_checker_catches_acl_changes_kept_off_the_log(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    verdict = _run(tmp_path, monkeypatch, "--test-faults", "--broker-canary", "acl_local_only")
    assert not verdict.ok
    assert any("after PUB was granted was refused" in line for line in verdict.lines())
