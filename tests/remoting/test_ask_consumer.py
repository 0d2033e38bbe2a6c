"""An operator's questions to one live 4.x consumer (RocketMQ's 307 GET_CONSUMER_RUNNING_INFO and
309 CONSUME_MESSAGE_DIRECTLY), through the broker node it is connected to: a bare remoting
connection plays the consumer (the C++ client, tested with 307 in ``test_clients_4x``, does not
implement 309), answering as a 4.x client does; the questions come from ``dledger consumer
running-info`` / ``consume-directly`` and ``client.cluster.ask_consumer``."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from cli import main as dledger_main
from client import Message, Producer, SendResult, errors
from client.cluster import ask_consumer
from client.cluster.routes import Routes
from protocol.remoting import codes
from protocol.remoting.command import Command
from protocol.remoting.record import decode_records
from tests.clusters import namesrv_group
from tests.namesrv.test_console_browser import CHROMIUM, CHROMIUM_ARGS, _playwright
from tests.nodes.test_processes import wait_until
from tests.remoting.raw import RawRemoting
from tests.remoting.test_endpoint import _addrs

pytestmark = pytest.mark.xdist_group("remoting-ask")

GROUP, CLIENT = "direct-g", "127.0.0.1@direct-1"
BEAT = json.dumps({"clientID": CLIENT, "consumerDataSet": [
    {"groupName": GROUP, "messageModel": "CLUSTERING", "consumeType": "CONSUME_PASSIVELY",
     "subscriptionDataSet": [{"topic": "direct-t", "subString": "*"}]}]}).encode()


@pytest.fixture(scope="module")
def ns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with namesrv_group(tmp_path_factory.mktemp("ask"),
                       "--remoting-listen", "127.0.0.1:0") as (address, _):
        yield address


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(dledger_main, ["consumer", *args])
    return result.exit_code, result.output


def test_a_consumer_consumes_one_message_again_and_answers_for_itself(ns: str) -> None:
    async def run() -> None:
        routes = Routes(ns)
        await routes.start()
        try:
            await asked_and_answered(ns, routes)
        finally:
            await routes.close()
    asyncio.run(run())


async def _send(ns: str, body: bytes) -> SendResult:
    async with Producer(ns) as producer:
        return await producer.send(Message("direct-t", body, tags="T", keys=("k1",)))


async def asked_and_answered(ns: str, routes: Routes) -> None:
    leader = (await _addrs(ns))["0"]
    sent = await _send(ns, b"once more")
    async with RawRemoting(leader) as peer:
        assert (await peer.call(codes.HEART_BEAT, body=BEAT)).code == codes.SUCCESS

        asked = asyncio.ensure_future(ask_consumer.consume_directly(
            routes, GROUP, CLIENT, sent.offset_msg_id))
        request = await peer.request(codes.CONSUME_MESSAGE_DIRECTLY)
        assert request.ext["consumerGroup"] == GROUP and request.ext["clientId"] == CLIENT
        assert request.ext["msgId"] == sent.msg_id
        record = decode_records(request.body)[0]
        assert (record.topic, record.body) == ("direct-t", b"once more")
        peer.answer(request, codes.SUCCESS, json.dumps(
            {"order": False, "autoCommit": True, "consumeResult": "CR_SUCCESS",
             "remark": "", "spentTimeMills": 3}).encode())
        result = await asked
        assert result["consumeResult"] == "CR_SUCCESS" and result["node"].startswith("a/")

        cli = asyncio.ensure_future(asyncio.to_thread(
            _cli, "consume-directly", "--namesrv", ns, GROUP, CLIENT, sent.offset_msg_id))
        request = await peer.request(codes.CONSUME_MESSAGE_DIRECTLY)
        peer.answer(request, codes.SUCCESS, json.dumps(
            {"consumeResult": "CR_LATER", "remark": "not now", "spentTimeMills": 5}).encode())
        code, output = await cli
        assert code == 1 and "CR_LATER in 5 ms: not now" in output, output

        cli = asyncio.ensure_future(asyncio.to_thread(
            _cli, "running-info", "--namesrv", ns, GROUP, CLIENT))
        request = await peer.request(codes.GET_CONSUMER_RUNNING_INFO)
        assert request.ext["consumerGroup"] == GROUP
        peer.answer(request, codes.SUCCESS, json.dumps(
            {"properties": {"consumeType": "CONSUME_PASSIVELY"},
             "subscriptionSet": [{"topic": "direct-t", "subString": "*"}]}).encode())
        code, output = await cli
        assert code == 0 and json.loads(output)["subscriptionSet"][0]["topic"] == "direct-t"

        refused = asyncio.ensure_future(ask_consumer.running_info(routes, GROUP, CLIENT))
        request = await peer.request(codes.GET_CONSUMER_RUNNING_INFO)
        peer.answer(request, codes.SYSTEM_ERROR, remark="no listener")
        with pytest.raises(errors.ClientNoAnswerError, match="no listener"):
            await refused

        with pytest.raises(errors.ClientNotConnectedError, match="none of the 3"):
            await ask_consumer.running_info(routes, GROUP, "nobody@0")
        with pytest.raises(errors.MessageNotFoundError):
            await ask_consumer.consume_directly(routes, GROUP, CLIENT, "a-00000000FFFFFF00-0")

        gone = asyncio.ensure_future(ask_consumer.running_info(routes, GROUP, CLIENT))
        await peer.request(codes.GET_CONSUMER_RUNNING_INFO)
        await peer.__aexit__()  # closed before it answers: an error at once, not a wait
        with pytest.raises((errors.ClientNoAnswerError, errors.ClientNotConnectedError)):
            await asyncio.wait_for(gone, 5)

    async def left() -> bool:
        try:
            await ask_consumer.running_info(routes, GROUP, CLIENT)
        except errors.ClientNotConnectedError:
            return True
        return False
    await wait_until(left, 10, "the closed connection's consumer to be dropped")


@pytest.mark.slow
def test_the_console_has_a_consumer_consume_one_message_again(ns: str) -> None:
    """The console's consumer group view: its form, its confirmation, the consumer's answer."""
    pw = _playwright()
    expect = pw.expect
    sent = asyncio.run(_send(ns, b"again from the console"))
    ready, stop = threading.Event(), threading.Event()
    asked: list[Command] = []

    async def peer() -> None:
        async with RawRemoting((await _addrs(ns))["0"]) as c:
            assert (await c.call(codes.HEART_BEAT, body=BEAT)).code == codes.SUCCESS
            ready.set()
            asked.append(await c.request(codes.CONSUME_MESSAGE_DIRECTLY, timeout_s=60))
            c.answer(asked[0], codes.SUCCESS, json.dumps(
                {"consumeResult": "CR_SUCCESS", "remark": "", "spentTimeMills": 7}).encode())
            await asyncio.to_thread(stop.wait, 60)  # connected until the page has its answer

    thread = threading.Thread(target=lambda: asyncio.run(peer()), daemon=True)
    thread.start()
    try:
        assert ready.wait(30), "the playing consumer did not connect"
        with pw.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.goto(f"http://{ns}/console#consumers")
                page.locator('#consumer-pick [name="group"]').fill(GROUP)
                page.locator('#consumer-pick button[type="submit"]').click()
                form = page.locator("#direct-form")
                expect(form).to_be_visible(timeout=15_000)
                expect(form.locator('[name="client_id"]')).to_have_value(CLIENT)
                form.locator('[name="offset_msg_id"]').fill(sent.offset_msg_id)
                form.locator('button[type="submit"]').click()
                expect(page.locator("#confirm-text")).to_contain_text(
                    f"Have consumer {CLIENT} of {GROUP} consume {sent.offset_msg_id}")
                page.click("#confirm-ok")
                expect(page.locator("#direct-result")).to_contain_text(
                    "CR_SUCCESS in 7 ms via a/", timeout=30_000)
            finally:
                browser.close()
    finally:
        stop.set()
        thread.join(timeout=30)
    assert decode_records(asked[0].body)[0].body == b"again from the console"
