"""The request table's delay kind (``broker.core.requests``): RECALL, a producer's recall of a
delayed message that is still pending (RocketMQ 5.x's RecallMessage), and what a recall needs
of the state: the schedule-queue place of the message its handle names.

A recall names the message as its send's answer did (the commitlog position and slot of its
copy in the schedule queue, its real topic and its message id; the gRPC endpoint keeps them in a
signed recall handle). The leader finds that copy in the schedule queue, checks
that it is that message, and proposes a TIMER_RECALL entry; the apply decides (a delivery
applied first wins: NOT_RECALLABLE), on every replica alike, so a new leader never delivers a
recalled message. ``broker.api.table`` puts ``HANDLERS`` in the request table.
"""

from __future__ import annotations

import bisect
import time

from broker.core.requests import ID_MAX_CHARS, Handler, handlers, integer, text, user_topic
from broker.features.delay.entries import TimerRecall
from broker.features.delay.model import SCHEDULE_QUEUE, SCHEDULE_TOPIC, timer_of
from broker.features.host import BrokerHost
from protocol.broker_errors import MessageNotFoundError
from protocol.broker_kinds import RECALL, SendRefusedError, message_id
from protocol.errors import DLedgerError

__all__ = ["HANDLERS", "schedule_offset"]

HANDLERS: list[Handler] = []
handles = handlers(HANDLERS)


def schedule_offset(host: BrokerHost, position: int, slot: int) -> int | None:
    """The schedule-queue offset of the copy at (commitlog ``position``, ``slot``), if the
    queue holds one there (units are in log order: (position, slot) ascends)."""
    units = host.state.queues.get((SCHEDULE_TOPIC, SCHEDULE_QUEUE))
    if units is None:
        return None
    k = bisect.bisect_left(units, (position, slot), lo=units.first(), hi=len(units),
                           key=lambda u: (u.position, u.slot))
    if k < len(units) and (units[k].position, units[k].slot) == (position, slot):
        return k
    return None


@handles(RECALL, topic=user_topic, message_id=text(ID_MAX_CHARS), position=integer(),
         slot=integer())
async def recall(host: BrokerHost, topic: str, msg_id: str, position: int, slot: int) -> str:
    """The recalled message's id, once the recall is applied; MESSAGE_NOT_FOUND if the
    schedule queue holds no such message, NOT_RECALLABLE if it is no longer pending."""
    host.require_leader()
    await host.node.read_barrier()  # every earlier delivery and recall applied here
    offset = schedule_offset(host, position, slot)
    found = None
    if offset is not None:
        try:
            found = host.stored_message(position, slot)
        except (DLedgerError, IndexError):  # retention took it: nothing left to recall
            found = None
    if found is None or offset is None:
        raise MessageNotFoundError(f"no delayed message of {topic} at {position}/{slot} "
                                   "(never stored there, or its log segment was deleted)")
    real_topic, _, due = timer_of(found)
    if (real_topic, message_id(found[3], found[4])) != (topic, msg_id):
        raise SendRefusedError("NOT_RECALLABLE", f"the delayed message at {position}/{slot} is "
                               f"not {msg_id} of {topic}")
    result = await host.leader_commit(TimerRecall(int(time.time() * 1000), offset, due, topic,
                                                  msg_id))
    return result.detail
