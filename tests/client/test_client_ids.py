"""Every client of the library names itself ``<host>@<instance>`` by default (issue 34 items 7
and 19): producers, clustering push, orderly and lite pull consumers ``<host>@<pid>#<random>``
(unique per process, as RocketMQ's pid instance name, and per client within one), broadcasting
push consumers ``<host>@DEFAULT`` (stable: their progress file is named by it); the message
trace records the id the client reports. No cluster: nothing here connects."""

from __future__ import annotations

import os
import re
from typing import Any

from client import (
    LitePullConsumer,
    Message,
    Producer,
    PushConsumer,
    TransactionProducer,
    TransactionState,
)
from client.consumer.orderly import OrderlyPushConsumer
from client.identity import host
from client.types import ConsumeStatus, ReceivedMessage

NS = "127.0.0.1:1"  # (never dialled)


def _ok(batch: list[ReceivedMessage]) -> ConsumeStatus:
    return ConsumeStatus.SUCCESS


class _Checks:
    def execute_local_transaction(self, message: Message, arg: Any) -> TransactionState:
        return TransactionState.COMMIT

    def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        return TransactionState.COMMIT


def test_every_client_reports_one_format_and_the_trace_records_it() -> None:
    per_process = re.compile(re.escape(host()) + "@" + str(os.getpid()) + r"#[0-9a-f]{8}")
    clients: list[Any] = [Producer(NS, trace=True), TransactionProducer(NS, "txg", _Checks()),
               PushConsumer(NS, "g", _ok, trace=True), OrderlyPushConsumer(NS, "g", _ok),
               LitePullConsumer(NS, "g", trace=True)]
    ids = [c.client_id for c in clients]
    for client_id in ids:
        assert per_process.fullmatch(client_id), client_id
    assert len(set(ids)) == len(ids), "two clients of one process share an id"
    for c in clients:
        tracer = getattr(c, "tracer", None)
        assert tracer is None or tracer.client_id == c.client_id
    broadcasting = PushConsumer(NS, "g", _ok, model="broadcasting", trace=True)
    assert broadcasting.client_id == f"{host()}@DEFAULT"
    assert broadcasting.tracer is not None and broadcasting.tracer.client_id == f"{host()}@DEFAULT"
