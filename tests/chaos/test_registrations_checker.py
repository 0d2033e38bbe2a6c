"""The checker of forged registrations (``chaos.live.checkers.registrations``): what it judges
and what it only counts."""

from __future__ import annotations

from chaos.live.checkers.registrations import Attempt, check_registrations


def test_refused_forgeries_and_passing_controls_are_clean() -> None:
    v = check_registrations([Attempt("unsigned_claim", 401), Attempt("wrong_key_claim", 403),
                             Attempt("control", 200), Attempt("replay", 403),
                             Attempt("spoofed_unregister", 401), Attempt("far_claim", None)],
                            ["n0", None, "n1"])
    assert v.ok and v.summary() == {"forged": 4, "refused": 4, "controls": 1, "unanswered": 1,
                                    "routed_reads": 3}


def test_an_accepted_forgery_a_routed_forged_node_and_a_refused_control_are_named() -> None:
    v = check_registrations([Attempt("unsigned_claim", 200), Attempt("replay", 200),
                             Attempt("control", 401), Attempt("far_claim", 409)],
                            ["n0", "forged-3"])
    assert v.lines() == [
        "registrations: accepted: a unsigned_claim got 200",
        "registrations: accepted: a replay got 200",
        "registrations: control refused: a signed registration got 401",
        "registrations: routed: the forged node forged-3 was routed as the leader"]
    assert (v.forged, v.refused) == (3, 0)  # (a 409 is neither accepted nor refused by the guard)
