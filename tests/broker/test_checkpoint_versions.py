"""Old data directories still open: a version 7 checkpoint (fields by position), written by the
broker as it was at 608b40a, restores into today's state machine exactly as the same entries
applied afresh make it, feature by feature.

``tests/data/checkpoint-v7.cbor`` holds ``{"entries": [[index, position, payload]...],
"checkpoint": blob}``: topics, sends and a multi-run send with keys, a retried duplicate, delayed
messages (one delivered), an offset commit and an offset reset, queue locks, two transactions
(one open after a check-back, one rolled back), pop consumption, an ACL account and a deleted
topic, and the version 7 checkpoint of the state they made, both written by that broker's own
code (``BrokerState.snapshot`` and its entry encoders)."""

from __future__ import annotations

from pathlib import Path

import cbor2
import pytest

from broker.machine.state import CHECKPOINT_VERSION, BrokerState
from protocol.broker_errors import BadEntryError

FIXTURE = Path(__file__).resolve().parent / "data" / "checkpoint-v7.cbor"


def _fixture() -> tuple[list[list[object]], bytes]:
    data = cbor2.loads(FIXTURE.read_bytes())
    return data["entries"], data["checkpoint"]


def test_a_version_7_checkpoint_restores_what_its_entries_make_today() -> None:
    entries, blob = _fixture()
    assert cbor2.loads(blob)[0] == 7
    fresh = BrokerState()
    for index, position, payload in entries:
        assert fresh.apply(index, position, payload).status in ("OK", "SEND_OK")
    old = BrokerState.restore(blob)
    assert old.applied_index == fresh.applied_index == len(entries)
    assert old.snapshot() == fresh.snapshot()
    assert cbor2.loads(old.snapshot())[0] == CHECKPOINT_VERSION
    # each feature's part came across, not only an empty default
    assert set(old.txns.open) == {"T1"} and old.txns.decided == {"T2": "ROLLBACK"}
    assert len(old.timers) == 1
    assert old.locks.snapshot() == fresh.locks.snapshot() != []
    assert old.pops.snapshot() == fresh.pops.snapshot() != BrokerState().pops.snapshot()
    assert [a.access_key for a in old.acl.accounts.values()] == ["alice"]
    assert old.offsets[("g2", "orders", 0)] == 1 and "gone" not in old.topics


def test_a_checkpoint_names_each_feature_and_refuses_one_it_does_not_know() -> None:
    entries, _ = _fixture()
    state = BrokerState()
    for index, position, payload in entries:
        state.apply(index, position, payload)
    version, applied, core, features = cbor2.loads(state.snapshot())
    assert (version, applied) == (CHECKPOINT_VERSION, len(entries))
    assert list(features) == ["delay", "orderly", "txn", "pop", "acl", "subscription_groups"]
    assert set(core) == {"topics", "queues", "offsets", "dedup", "next_queue_no"}
    # a feature a later version adds is simply absent from this one: it starts empty
    del features["acl"]
    assert BrokerState.restore(cbor2.dumps([version, applied, core, features])).acl.accounts == {}
    features["future"] = []
    with pytest.raises(BadEntryError, match="future"):
        BrokerState.restore(cbor2.dumps([version, applied, core, features]))
