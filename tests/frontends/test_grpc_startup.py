"""``tests.frontends.grpc_helpers.started``: an official client whose startup raised is shut
down and started afresh once, with a warning; a second failure is raised."""

from __future__ import annotations

import asyncio
from typing import ClassVar

import pytest
from rocketmq import ClientConfiguration, Credentials
from rocketmq import Producer as RmqProducer
from rocketmq.v5.client.connection.rpc_client import RpcClient

from tests.frontends.grpc_helpers import started


class FlakyClient:
    """Fails its first ``fails`` startups (as the official client does when its settings do
    not come within its fixed wait); its shutdown after a failed startup raises, as the
    official client's did."""

    made: ClassVar[list[FlakyClient]] = []

    def __init__(self, fails: int) -> None:
        self.running = False
        self.fails = fails - len(FlakyClient.made)
        FlakyClient.made.append(self)

    def startup(self) -> None:
        if self.fails > 0:
            raise Exception("no settings received within 10 s")  # (the library's own type)
        self.running = True

    def shutdown(self) -> None:
        if not self.running:
            raise AttributeError("half-started client has no telemetry stream")


def test_a_failed_startup_is_tried_once_more_with_a_warning() -> None:
    FlakyClient.made = []
    with pytest.warns(UserWarning, match="FlakyClient.startup failed, started again: .*no settings"
                      ".*its shutdown then raised AttributeError"):
        client = started(lambda: FlakyClient(fails=1))
    assert client.running and len(FlakyClient.made) == 2 and client is FlakyClient.made[1]


def test_a_second_failure_is_raised() -> None:
    FlakyClient.made = []
    with pytest.warns(UserWarning), pytest.raises(Exception, match="no settings"):
        started(lambda: FlakyClient(fails=2))
    assert len(FlakyClient.made) == 2


def test_a_client_that_starts_is_returned_without_a_warning(recwarn: pytest.WarningsRecorder) -> None:
    FlakyClient.made = []
    assert started(lambda: FlakyClient(fails=0)).running
    assert len(recwarn) == 0 and len(FlakyClient.made) == 1


def test_a_client_starts_with_the_library_loop_current_even_after_asyncio_run() -> None:
    """The official client builds a route's telemetry stream in the caller's thread when the
    route came back fast, through ``asyncio.get_event_loop()``; after ``asyncio.run`` the
    thread has none, unless ``started`` gave it the library's loop."""
    RmqProducer(ClientConfiguration("127.0.0.1:9", Credentials()), [])  # (starts the library's loop)
    library_loop = RpcClient.get_channel_io_loop()
    assert library_loop is not None

    async def nothing() -> None:
        return None
    asyncio.run(nothing())
    with pytest.raises(RuntimeError, match="no current event loop"):
        asyncio.get_event_loop()

    seen: list[asyncio.AbstractEventLoop] = []

    class LoopClient:
        def startup(self) -> None:
            seen.append(asyncio.get_event_loop())
    started(LoopClient)
    assert seen == [library_loop]
