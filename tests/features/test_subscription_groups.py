"""Consumer groups' settings (issue 35, item 2): the pure part (``broker.features.admin.model``),
its entry (strictly decoded: a bad value is refused by name) and its apply, kept in the state's
checkpoint."""

from __future__ import annotations

from typing import Any

import cbor2
import pytest

from broker.features.admin.entries import KIND_SUBSCRIPTION_GROUP_PUT, SubscriptionGroupPut
from broker.features.admin.model import GROUPS_MAX, SubscriptionGroups, check_attempts
from broker.machine.kinds import decode, encode
from broker.machine.state import BrokerState
from protocol.broker_errors import BadEntryError


def test_a_setting_is_applied_cleared_and_kept_in_the_checkpoint() -> None:
    s = BrokerState()
    put = SubscriptionGroupPut(1000, "two", 2)
    assert decode(encode(put)) == put
    assert s.apply(1, 0, encode(put)).status == "OK"
    assert s.apply(2, 0, encode(SubscriptionGroupPut(1001, "five", 5))).status == "OK"
    table = s.subscription_groups
    assert table.max_delivery_attempts("two", 16) == 2
    assert table.max_delivery_attempts("other", 16) == 16  # no setting: the broker's default
    again = BrokerState.restore(s.snapshot())
    assert again.subscription_groups == table and len(again.subscription_groups) == 2
    assert s.apply(3, 0, encode(SubscriptionGroupPut(1002, "two", None))).status == "OK"
    assert table.get("two") is None and table.max_delivery_attempts("two", 16) == 16
    assert [g for g, _ in table.groups()] == ["five"]


@pytest.mark.parametrize("attempts", [0, -1, 10_001, "2", 2.0, True])
def test_a_bad_number_of_attempts_is_refused_by_name(attempts: Any) -> None:
    with pytest.raises(ValueError, match=r"max delivery attempts must be an integer in 1\.\.10000"):
        check_attempts(attempts)
    with pytest.raises(BadEntryError, match="malformed entry of kind 20"):
        decode(cbor2.dumps([1, KIND_SUBSCRIPTION_GROUP_PUT, 1000, "g", attempts]))


@pytest.mark.parametrize("group", ["", "x" * 256, 7])
def test_a_bad_group_name_in_an_entry_is_refused(group: Any) -> None:
    with pytest.raises(BadEntryError, match="malformed entry of kind 20"):
        decode(cbor2.dumps([1, KIND_SUBSCRIPTION_GROUP_PUT, 1000, group, 3]))


def test_the_table_is_bounded() -> None:
    t = SubscriptionGroups()
    for k in range(GROUPS_MAX):
        assert t.put(f"g{k}", 3) == "OK"
    assert t.put("one-more", 3) == "TOO_MANY_GROUPS"
    assert t.put("g0", 4) == "OK"  # a group that has one may change it
    assert t.put("g1", None) == "OK" and t.put("one-more", 3) == "OK"


@pytest.mark.parametrize("blob", [{}, [["g"]], [["g", 0]], [["g", None]], [[1, 3]]])
def test_a_malformed_checkpoint_part_is_refused(blob: Any) -> None:
    with pytest.raises(ValueError):
        SubscriptionGroups.restore(blob)
