"""The ACL checker (``chaos.live.checkers.acl``) on histories written out: it judges a send
against the change in force from its start to its end, and leaves one that overlaps a change
unjudged (either outcome is right: a send called just before a change began may reach the leader
after the change was applied). The history of the one CI failure of the ACL failover test, a
false alarm, is the first case."""

from __future__ import annotations

from chaos.live.checkers.acl import PermChange, SendAttempt, check_acl

DENY_THEN_PUB = [PermChange(-0.0025, 0.0, False), PermChange(0.0503, 0.0546, True)]


def test_a_send_overlapping_the_next_change_is_not_judged() -> None:
    """Called 0.0501 s after the revoke's answer and 0.2 ms before the grant began, accepted
    after the grant was applied: not a violation (it was one before sends had an end)."""
    sends = [SendAttempt(0.002 + k * 0.0005, 0.0024 + k * 0.0005, "denied") for k in range(90)]
    sends.append(SendAttempt(0.0501, 0.0570, "ok"))
    verdict = check_acl(DENY_THEN_PUB, sends)
    assert verdict.ok, verdict.lines()
    assert (verdict.judged, verdict.unjudged) == (90, 1)


def test_a_send_accepted_wholly_within_a_revoke_is_caught() -> None:
    verdict = check_acl(DENY_THEN_PUB, [SendAttempt(0.0400, 0.0450, "ok")])
    assert verdict.lines() == ["acl: a send that began 0.040 s after PUB was revoked was "
                               "accepted (change 1 of 2)"]


def test_a_send_refused_wholly_within_a_grant_is_caught() -> None:
    verdict = check_acl(DENY_THEN_PUB, [SendAttempt(0.0600, 0.0610, "denied"),
                                        SendAttempt(0.0620, 0.0630, "ok")])
    assert verdict.lines() == ["acl: a send that began 0.005 s after PUB was granted was "
                               "refused (change 2 of 2)"]
    assert verdict.judged == 2


def test_sends_during_a_change_or_failed_are_counted_not_judged() -> None:
    verdict = check_acl(DENY_THEN_PUB, [SendAttempt(0.0510, 0.0520, "ok"),  # during change 2
                                        SendAttempt(0.0100, 0.0110, "failed")])
    assert verdict.ok and (verdict.judged, verdict.unjudged) == (0, 2)
