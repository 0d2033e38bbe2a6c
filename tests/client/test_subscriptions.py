"""Members of one consumer group that subscribe differently lose messages (issue 34 item 8): the
comparison every member, ``dledger consumer status`` and the console make
(``client.consumer.membership.subscription_conflict``, ``summarize_consumers``), and the status
text's warning. Pure: no cluster (the live test is in ``test_consumer_group_live``)."""

from __future__ import annotations

from typing import Any

from cli.consumers.admin import status_text
from client.cluster.admin_views import summarize_consumers
from client.consumer.membership import subscription_conflict


def member(client_id: str, subs: dict[str, str], model: str = "clustering") -> dict[str, Any]:
    return {"client_id": client_id, "model": model, "subscriptions": subs}


def test_alike_members_and_their_retry_topics_and_broadcasting_members_are_no_conflict() -> None:
    assert subscription_conflict([]) is None
    assert subscription_conflict([member("a", {"t": "*"})]) is None
    assert subscription_conflict([member("a", {"t": "*", "%RETRY%g": "*"}),
                                  member("b", {"t": "*"}),  # (a lite consumer: no retry topic)
                                  member("c", {"u": "x"}, "broadcasting")]) is None


def test_another_topic_or_another_expression_is_a_conflict_naming_who_reads_what() -> None:
    assert subscription_conflict([member("b", {"t": "TagA"}), member("a", {"t": "*"}),
                                  member("c", {"t": "*"})]) == "a, c: t * | b: t TagA"
    assert subscription_conflict([member("a", {"t": "*", "u": "*"}), member("b", {"t": "*"})]) \
        == "a: t *; u * | b: t *"
    assert subscription_conflict([member("a", {"t": "*"}), member("b", {})]) == \
        "a: t * | b: nothing"


def test_the_status_warns_when_the_members_differ_and_not_when_they_agree() -> None:
    def view(*members: dict[str, Any]) -> dict[str, Any]:
        return {"group": "a", "node": "n0", "leader": True, "members": list(members),
                "queues": [["t", 0, 3, 5]]}
    alike = summarize_consumers("g", [view(member("a", {"t": "*"}), member("b", {"t": "*"}))])
    assert alike["subscription_conflict"] is None
    assert "WARNING" not in status_text(alike)
    odd = summarize_consumers("g", [view(member("a", {"t": "*"})),
                                    {**view(member("b", {"t": "TagA"})), "node": "n1"}])
    assert odd["subscription_conflict"] == "a: t * | b: t TagA"
    assert "WARNING: the members subscribe differently" in status_text(odd)
    assert "(a: t * | b: t TagA)" in status_text(odd)
