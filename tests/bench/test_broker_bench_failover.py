"""The broker benchmark's failover reading (issue 16, item 22): from the kill to the first
acknowledgement of a send invoked after the kill, not to the first acknowledgement read after it
(which can be the old leader's, of a send made before the kill)."""

from __future__ import annotations

import pytest

from bench.failover import first_ack_ms, first_fresh_ack_ms

KILL_S = 100.0


def test_an_ack_of_a_send_invoked_before_the_kill_does_not_end_the_failover() -> None:
    sends = [
        (99.90, 99.95),  # acknowledged by the old leader before the kill
        (99.99, 100.066),  # invoked before the kill, its ack read 66 ms after it (a late loop)
        (99.98, 101.30),  # invoked before, retried and acknowledged by the new leader
        (100.40, 101.45),  # the first send invoked after the kill: acknowledged 1.45 s after it
        (100.20, 101.60),
    ]
    assert first_fresh_ack_ms(sends, KILL_S) == pytest.approx(1450)
    # the old rule (the first ack read more than 50 ms after the kill) takes the old leader's
    # ack of a send made before the kill: 66 ms, below any election timeout
    old_rule_ms = (min(acked for _, acked in sends if acked > KILL_S + 0.05) - KILL_S) * 1000
    assert old_rule_ms == pytest.approx(66)
    assert first_ack_ms(sends, KILL_S) == pytest.approx(66)  # printed beside the reading


def test_no_send_invoked_after_the_kill_acknowledged_gives_no_reading() -> None:
    sends = [(99.9, 99.95), (99.99, 100.5)]
    assert first_fresh_ack_ms(sends, KILL_S) is None
    assert first_fresh_ack_ms([], KILL_S) is None
    assert first_ack_ms([(99.9, 99.95)], KILL_S) is None


def test_the_order_of_the_records_does_not_matter() -> None:
    sends = [(100.5, 102.0), (100.1, 101.2), (100.3, 101.1), (99.0, 100.01)]
    assert first_fresh_ack_ms(sends, KILL_S) == pytest.approx(1100)
    assert first_fresh_ack_ms(reversed(sends), KILL_S) == pytest.approx(1100)
