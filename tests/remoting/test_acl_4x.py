"""Access control for RocketMQ 4.x clients (``--acl`` with ``--remoting-listen``): a request
signed with the client's AccessKey and Signature is judged by that account's permissions, as our
own clients' are; an unsigned one, a wrong secret, a send without PUB are refused by name
(NO_PERMISSION) and store nothing; a follower's forward goes to the leader signed as the same
account; the unmodified C++ client, given its credentials, sends, and without them does not."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.features.acl.model import PUB, SUB, Account
from broker.frontends.remoting.signature import signature_of
from client import Credentials, Message, Producer
from client.cluster.routes import Routes
from protocol import broker_kinds as bp
from protocol.frames import encode_frame
from protocol.group_client import GroupClient
from protocol.remoting import codes
from protocol.remoting.command import Command, encode
from protocol.remoting.record import join_properties
from tests.clusters import namesrv_group
from tests.nodes.test_processes import wait_until
from tests.remoting.clients import cpp, cpp_python, finish
from tests.remoting.raw import RawRemoting
from tests.remoting.test_endpoint import _addrs, _send_ext

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("remoting-acl")]

ROOT = Credentials("root", "root-secret-1")
CPP = Credentials("cpp", "cpp-secret-12")  # PUB on acl-orders and its producer group only


@pytest.fixture(scope="module")
def ns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cpp_python()
    patch = pytest.MonkeyPatch()
    patch.setenv("DLEDGER_ACL_SECRET_ROOT", ROOT.secret_key)
    patch.setenv("DLEDGER_ACCESS_KEY", ROOT.access_key)  # (the group's routing warm-up)
    patch.setenv("DLEDGER_SECRET_KEY", ROOT.secret_key)
    try:
        with namesrv_group(tmp_path_factory.mktemp("acl4x"), "--remoting-listen",
                           "127.0.0.1:0", "--acl", "--acl-admin-key", "root") as (address, _):
            patch.delenv("DLEDGER_ACCESS_KEY")
            patch.delenv("DLEDGER_SECRET_KEY")
            asyncio.run(_accounts(address))
            yield address
    finally:
        patch.undo()


async def _accounts(ns: str) -> None:
    async with Producer(ns, credentials=ROOT) as root:
        for topic in ("acl-orders", "acl-logs"):
            await root.send(Message(topic, b"seed"))
    routes = Routes(ns, credentials=ROOT)
    await routes.start()
    try:
        g = (await routes.cluster_groups())[0]
        account = Account(CPP.access_key, CPP.secret_key,
                          topic_perms=(("acl-logs", SUB), ("acl-orders", PUB)),
                          group_perms=(("cpp-acl-p", PUB),))
        client = routes.group_client(g)
        _, status = await client.call_leader(bp.ACL_PUT, account.row())
        assert status == "OK"
        # the account is committed; every node (a follower judges what it forwards) must also
        # have applied it, which a loaded machine's follower had not yet once
        commit = (await client.call_leader(bp.BROKER_STATUS))[1]["raft"]["commit_index"]
        for node in g.nodes:
            await wait_until(lambda n=node: _applied(client, n, commit), 20,
                             f"{node} to apply the account")
    finally:
        await routes.close()


async def _applied(client: GroupClient, node: str, index: int) -> bool:
    return bool((await client.call(node, bp.BROKER_STATUS))["applied_index"] >= index)


def _signed(code: int, ext: dict[str, str], body: bytes, who: Credentials,
            secret: str | None = None) -> tuple[int, dict[str, str], bytes]:
    ext = {**ext, "AccessKey": who.access_key}
    ext["Signature"] = signature_of(ext, body, secret or who.secret_key)
    return code, ext, body


async def _stored(c: RawRemoting, topic: str) -> int:
    """Messages in the topic's queue 0 (asked as root)."""
    answer = await c.call(*_signed(codes.GET_MAX_OFFSET, {"topic": topic, "queueId": "0"}, b"",
                                   ROOT))
    assert answer.code == codes.SUCCESS, answer.remark
    return int(answer.ext["offset"])


def test_4x_requests_are_judged_by_their_signing_account(ns: str) -> None:
    async def run() -> None:
        addrs = await _addrs(ns)
        props = join_properties("", [], "", [])
        async with RawRemoting(addrs["0"]) as c:
            before = await _stored(c, "acl-orders")
            ext = _send_ext("acl-orders", 0, props)
            refused: list[Command] = [
                await c.call(codes.SEND_MESSAGE_V2, ext, b"unsigned"),
                await c.call(*_signed(codes.SEND_MESSAGE_V2, ext, b"forged", CPP, "not-the-secret")),
                await c.call(*_signed(codes.SEND_MESSAGE_V2, _send_ext("acl-logs", 0, props),
                                      b"no PUB", CPP)),
                await c.call(*_signed(codes.UPDATE_CONSUMER_OFFSET, {
                    "consumerGroup": "nobody", "topic": "acl-logs", "queueId": "0",
                    "commitOffset": "1"}, b"", CPP)),
            ]
            assert [r.code for r in refused] == [codes.NO_PERMISSION] * 4, \
                [(r.code, r.remark) for r in refused]
            assert "sign requests" in refused[0].remark
            assert "signature does not match" in refused[1].remark
            assert "PUB on topic 'acl-logs'" in refused[2].remark
            assert "group 'nobody'" in refused[3].remark
            tampered = _signed(codes.SEND_MESSAGE_V2, ext, b"as signed", CPP)
            assert (await c.call(tampered[0], tampered[1], b"not as signed")).code \
                == codes.NO_PERMISSION
            ok = await c.call(*_signed(codes.SEND_MESSAGE_V2, ext, b"signed", CPP))
            assert ok.code == codes.SUCCESS, ok.remark
            assert await _stored(c, "acl-orders") == before + 1  # the refused stored nothing
            # two sends in one write travel to the API together (one account's are gathered):
            # the one refused must not fail the other
            pair = [_signed(codes.SEND_MESSAGE_V2, ext, b"together", CPP),
                    _signed(codes.SEND_MESSAGE_V2, _send_ext("acl-logs", 0, props),
                            b"together, no PUB", CPP)]
            c.send_raw(b"".join(encode_frame(encode(Command(code, 900 + k, ext=e, body=b)))
                                for k, (code, e, b) in enumerate(pair)))
            answers: dict[int, int] = {}
            while len(answers) < 2:
                got = await asyncio.wait_for(c.read(), 10)
                if got.is_response:
                    answers[got.opaque] = got.code
            assert answers == {900: codes.SUCCESS, 901: codes.NO_PERMISSION}, answers
        async with RawRemoting(addrs["1"]) as follower:  # forwarded, signed as cpp
            sent = await follower.call(*_signed(codes.SEND_MESSAGE_V2, ext, b"via follower", CPP))
            assert sent.code == codes.SUCCESS, sent.remark
            denied = await follower.call(*_signed(
                codes.SEND_MESSAGE_V2, _send_ext("acl-logs", 0, props), b"no PUB", CPP))
            assert denied.code == codes.NO_PERMISSION and "PUB" in denied.remark
        async with RawRemoting(addrs["0"]) as c:
            assert await _stored(c, "acl-orders") == before + 3
    asyncio.run(run())


def test_the_cpp_client_sends_with_its_credentials_and_not_without(
        ns: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CPP_SECRET_KEY", CPP.secret_key)
    args = ["produce", "--namesrv", ns, "--topic", "acl-orders", "--group", "cpp-acl-p",
            "--count", "10", "--send-timeout-ms", "2000"]
    signed = finish(cpp(tmp_path / "signed", *args, "--access-key", CPP.access_key), 90)
    assert len(signed) == 10 and all("error" not in e for e in signed), signed[:3]
    unsigned = finish(cpp(tmp_path / "unsigned", *args[:-2], "--count", "3"), 90)
    assert len(unsigned) == 3 and all("error" in e for e in unsigned), unsigned
    monkeypatch.setenv("CPP_SECRET_KEY", "a-wrong-secret")
    wrong = finish(cpp(tmp_path / "wrong", *args[:-4], "--count", "3", "--send-timeout-ms",
                       "2000", "--access-key", CPP.access_key), 90)
    assert len(wrong) == 3 and all("error" in e for e in wrong), wrong
