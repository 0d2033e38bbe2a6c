"""Applying delayed messages: a send the leader rewrote for the schedule topic stores each message
in the schedule queue with a timer for its due time; a TIMER_DELIVER entry takes due timers out of
the index and stores their copies in their real queues; a TIMER_RECALL entry takes a pending
timer out without delivering it (whichever of a delivery and a recall is applied first wins).
Functions over the core state and the feature's ``DelayIndex`` (kept under ``delay``); pure and
deterministic. ``KINDS`` registers the delivery and recall entries once; ``ROUTES`` gives the
schedule topic's sends to ``apply_schedule``."""

from __future__ import annotations

from broker.core.applied import ApplyResult, tag_hash
from broker.core.entries import StoredSend
from broker.core.registry import EntryKind, StoredTopics
from broker.core.state import CoreState, TopicRoute
from broker.features.delay.entries import (
    KIND_TIMER_DELIVER,
    KIND_TIMER_RECALL,
    TimerDeliver,
    TimerRecall,
    decode_timer_deliver,
    decode_timer_recall,
    encode_timer_deliver,
    encode_timer_recall,
    timer_messages,
)
from broker.features.delay.model import SCHEDULE_QUEUE, SCHEDULE_TOPIC, DelayIndex, timer_of
from protocol.broker_errors import BrokerError
from protocol.topics import TopicConfig, validate_config

__all__ = ["DELAY_STATE_CANARIES", "KINDS", "NOT_RECALLABLE", "PART", "ROUTES", "apply_deliver",
           "apply_recall", "apply_schedule"]

PART = "delay"  # the DelayIndex's name in the state and its checkpoints
# Seeded bugs (tests only): "timer_redeliver" stores a delivered timer's message again when a
# delivery names it twice (the index's check skipped); "recall_ignored" answers a recall OK and
# leaves its timer pending (the message is delivered at its due time all the same).
DELAY_STATE_CANARIES = frozenset({"timer_redeliver", "recall_ignored"})
NOT_RECALLABLE = "NOT_RECALLABLE"  # a recall of a timer no longer pending


def apply_schedule(state: CoreState, index: int, position: int, e: StoredSend,
                   first_slot: int) -> ApplyResult:
    """A run the leader rewrote for the schedule topic (``model.route_run``): each message
    stored in the schedule queue with a timer for its due time, its real topic created now if
    it does not exist and the leader auto-creates topics (as RocketMQ's send does before the
    rewrite: a consumer may subscribe to the topic while the message waits). The run answers
    with each message's real queue id (its queue offset is known only once delivered)."""
    try:
        timers = [timer_of(m) for m in e.messages]  # all or nothing: checked first
    except (ValueError, TypeError) as err:
        return ApplyResult(index, "BAD_ENTRY", e.topic, detail=str(err), first_slot=first_slot)
    for topic in dict.fromkeys(topic for topic, _, _ in timers):
        _topic_of(state, topic, e.auto_create, e.default_queues)
    index_ = state.part(PART, DelayIndex)
    return state.store(index, position, SCHEDULE_TOPIC, SCHEDULE_QUEUE, e.messages,
                       e.store_ts_ms, first_slot, real_qids=[qid for _, qid, _ in timers],
                       stored=lambda k, offset: index_.add(timers[k][2], offset))


def apply_deliver(state: CoreState, index: int, position: int, e: TimerDeliver) -> ApplyResult:
    """Due timers to their real queues: each one still pending is taken from the index and
    its copy (slot = its place in the entry) appended to its queue; one taken already (a
    second leader proposed it too) is skipped. A real topic deleted since is created again
    if the leader auto-creates topics, else the message is dropped with its topic; a queue
    beyond a topic shrunk since goes to queue (id mod write queues)."""
    woken: dict[tuple[str, int], ApplyResult] = {}
    redeliver = "timer_redeliver" in state.config.canaries
    timers = state.part(PART, DelayIndex)
    for slot, (offset, due_ms, topic, qid, m) in enumerate(e.items):
        if not timers.take(offset, due_ms) and not redeliver:
            continue
        cfg = _topic_of(state, topic, e.auto_create, e.default_queues)
        if cfg is None or cfg.write_queues == 0:
            continue
        qid %= cfg.write_queues
        state.queue(topic, qid).append(position, slot, len(m[0]), tag_hash(m[1]), e.store_ts_ms)
        woken[(topic, qid)] = ApplyResult(index, "SEND_OK", topic, qid)
    return ApplyResult(index, "SEND_OK", runs=tuple(woken.values()))


def _topic_of(state: CoreState, topic: str, auto_create: bool,
              default_queues: int) -> TopicConfig | None:
    """The topic's config; a topic that does not exist is created with ``default_queues`` when
    the entry's leader auto-creates topics (None if it does not, or the name is refused)."""
    cfg = state.topics.get(topic)
    if cfg is None and auto_create:
        try:
            cfg = state.topics[topic] = validate_config(
                TopicConfig(topic, default_queues, default_queues), allow_system=True)
        except BrokerError:
            cfg = None
    return cfg


def apply_recall(state: CoreState, index: int, position: int, e: TimerRecall) -> ApplyResult:
    """A recall: the timer taken out of the index (its message is never delivered), or, when it
    is no longer pending, NOT_RECALLABLE (delivered at its due time, or recalled before)."""
    if "recall_ignored" in state.config.canaries:  # the seeded bug: answered, not taken
        return ApplyResult(index, "OK", e.topic, detail=e.message_id)
    if state.part(PART, DelayIndex).take(e.offset, e.due_ms):
        return ApplyResult(index, "OK", e.topic, detail=e.message_id)
    return ApplyResult(index, NOT_RECALLABLE, e.topic,
                       detail=f"message {e.message_id} of {e.topic} (due at {e.due_ms} ms) is "
                              "not pending: delivered, or recalled already")


def _stored(e: TimerDeliver) -> StoredTopics:
    return e.store_ts_ms, [(topic, qid, [m]) for _, _, topic, qid, m in e.items]


KINDS = (EntryKind("timer_deliver", (KIND_TIMER_DELIVER,), (TimerDeliver,), encode_timer_deliver,
                   decode_timer_deliver, apply_deliver, stored=_stored, messages=timer_messages),
         EntryKind("timer_recall", (KIND_TIMER_RECALL,), (TimerRecall,), encode_timer_recall,
                   decode_timer_recall, apply_recall))
ROUTES: dict[str, TopicRoute] = {SCHEDULE_TOPIC: apply_schedule}
