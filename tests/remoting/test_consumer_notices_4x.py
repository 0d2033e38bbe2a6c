"""A broker node's NOTIFY_CONSUMER_IDS_CHANGED on the remoting endpoint, seen from the wire: the
group's other consumers on the node are told when one joins, the joiner is not (it rebalances
once it has heartbeated every node), unless it asked the node for the group's members before
it joined (it may have rebalanced on a list without itself)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from protocol.frames import encode_frame
from protocol.remoting import codes
from protocol.remoting.command import Command, encode
from tests.clusters import namesrv_group
from tests.remoting.raw import RawRemoting
from tests.remoting.test_endpoint import _addrs


@pytest.fixture(scope="module")
def ns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with namesrv_group(tmp_path_factory.mktemp("notices"),
                       "--remoting-listen", "127.0.0.1:0") as (address, _):
        yield address


def test_a_joining_consumer_tells_the_others_but_is_not_told_itself(ns: str) -> None:
    """NOTIFY_CONSUMER_IDS_CHANGED goes to the group's other consumers on the node when one
    joins, not to the joiner: a notice from each node it reaches would start rebalances while
    it still connects to the rest (the C++ client then fails an offset query on its own lock,
    and starts that queue at its end)."""
    def beat(client_id: str) -> bytes:
        return json.dumps({"clientID": client_id, "consumerDataSet": [
            {"groupName": "notice-g", "messageModel": "CLUSTERING",
             "subscriptionDataSet": [{"topic": "t", "subString": "*"}]}]}).encode()

    async def heartbeat_told(c: RawRemoting, client_id: str) -> list[int]:
        """The codes of the server's requests on ``c`` before its heartbeat's answer (a notice
        to the joiner is written before the answer, on the same connection)."""
        c.send_raw(encode_frame(encode(Command(codes.HEART_BEAT, 7, body=beat(client_id)))))
        told = []
        while True:
            cmd = await asyncio.wait_for(c.read(), 10)
            if cmd.is_response and cmd.opaque == 7:
                assert cmd.code == codes.SUCCESS, cmd.remark
                return told
            told.append(cmd.code)

    async def run() -> None:
        leader = (await _addrs(ns))["0"]
        async with RawRemoting(leader) as first, RawRemoting(leader) as second:
            assert await heartbeat_told(first, "first@1") == []
            assert await heartbeat_told(second, "second@1") == []  # the joiner: not told
            notice = await first.request(codes.NOTIFY_CONSUMER_IDS_CHANGED)  # the other: told
            assert notice.ext["consumerGroup"] == "notice-g"
            assert await heartbeat_told(second, "second@1") == []  # (no change: no notice)
            async with RawRemoting(leader) as third:  # asks for the members, then joins
                listed = await third.call(codes.GET_CONSUMER_LIST_BY_GROUP,
                                          {"consumerGroup": "notice-g"})
                assert sorted(json.loads(listed.body)["consumerIdList"]) == ["first@1",
                                                                            "second@1"]
                assert await heartbeat_told(third, "third@1") == [
                    codes.NOTIFY_CONSUMER_IDS_CHANGED]  # told: it saw a list without itself
                assert await heartbeat_told(third, "third@1") == []
    asyncio.run(run())
