"""The pop and FIFO checker (``chaos.live.checkers.pop``) on made-up histories: what it must
find (a lost send, a message back after its ack, two of one group in flight, a group out of
order), what it must not claim when the times do not prove it, and the parallel deliveries it
counts."""

from __future__ import annotations

from chaos.live.checkers.pop import Ack, Delivery, check_pop


def got(mid: str, began: float, ended: float, group: str, seq: int, attempt: int = 1) -> Delivery:
    return Delivery(mid, began, attempt, ended, group, seq)


def acked(mid: str, sent: float, ok: bool = True) -> Ack:
    return Ack(mid, sent + 0.05, sent, ok)


def test_a_clean_fifo_history_passes_and_counts_the_groups_in_parallel() -> None:
    # A0 then A1 one after the other; B0 and B1 meanwhile, beside them
    deliveries = [got("a0", 0.0, 0.1, "A", 0), got("b0", 0.0, 0.2, "B", 0),
                  got("a1", 1.0, 1.1, "A", 1), got("b1", 1.0, 1.2, "B", 1)]
    acks = [acked("a0", 0.9), acked("b0", 0.95), acked("a1", 2.0), acked("b1", 2.0)]
    v = check_pop({"a0", "b0", "a1", "b1"}, deliveries, acks)
    assert v.ok, v.lines()
    assert v.parallel_s == [0.2, 1.2]  # B0 beside A0, B1 beside A1


def test_two_of_one_group_in_flight_at_once_is_an_overlap() -> None:
    deliveries = [got("a0", 0.0, 0.1, "A", 0), got("a1", 0.2, 0.3, "A", 1)]
    acks = [acked("a0", 0.9), acked("a1", 1.0)]  # A1 received before A0's ack was even sent
    v = check_pop({"a0", "a1"}, deliveries, acks)
    assert not v.ok and len(v.overlap) == 1 and "a1 (#1) handed out while a0 (#0)" in v.overlap[0]
    assert any(line.startswith("fifo: overlap") for line in v.lines())


def test_a_group_handed_out_out_of_order_is_disorder() -> None:
    deliveries = [got("a1", 0.0, 0.1, "A", 1), got("a0", 0.5, 0.6, "A", 0)]
    acks = [acked("a1", 0.2), acked("a0", 0.7)]
    v = check_pop({"a0", "a1"}, deliveries, acks)
    assert v.disorder == ["group A: #1 (a1) handed out before #0 (a0)"] and not v.overlap


def test_a_failed_ack_may_have_been_applied_so_it_ends_the_window() -> None:
    """A0's ack failed at 0.5 (its answer lost, perhaps applied), and A1 came at 0.7: not proved
    to overlap; its redelivery and a later ack do not reopen the window."""
    deliveries = [got("a0", 0.0, 0.1, "A", 0), got("a1", 0.6, 0.7, "A", 1),
                  got("a0", 5.0, 5.1, "A", 0, attempt=2)]
    acks = [acked("a0", 0.5, ok=False), acked("a1", 0.8), acked("a0", 5.2)]
    v = check_pop({"a0", "a1"}, deliveries, acks)
    assert not v.overlap and not v.disorder  # (A0 again after A1: a redelivery, not an order)


def test_times_that_do_not_prove_an_order_are_not_judged() -> None:
    # both receives were under way together: which went out first is unknown
    deliveries = [got("a1", 0.0, 0.5, "A", 1), got("a0", 0.2, 0.6, "A", 0)]
    acks = [acked("a1", 0.55), acked("a0", 0.7)]
    v = check_pop({"a0", "a1"}, deliveries, acks)
    assert not v.disorder


def test_messages_without_a_group_or_never_acked_are_left_out_of_fifo() -> None:
    deliveries = [got("n0", 0.0, 0.1, "", -1), got("n1", 0.0, 0.1, "", -1),
                  got("a0", 0.0, 0.1, "A", 0), got("a1", 0.2, 0.3, "A", 1)]
    acks = [acked("n0", 1.0), acked("n1", 1.0), acked("a1", 1.0)]  # a0 never acked
    v = check_pop({"n0", "n1", "a0", "a1"}, deliveries, acks)
    assert v.ok and v.parallel_s == []


def test_loss_and_redelivery_after_ack_are_still_judged() -> None:
    deliveries = [Delivery("m1", 0.0, 1), Delivery("m1", 2.0, 2)]
    v = check_pop({"m1", "m2"}, deliveries, [Ack("m1", 1.0)])
    assert v.lost == ["m2"] and len(v.after_ack) == 1 and not v.ok
