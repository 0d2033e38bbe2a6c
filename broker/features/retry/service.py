"""The leader's side of retry and dead letters (``broker.features.retry.model``): a consumer's
send-back and an operator's dead-letter resend, each read from the commitlog at the named queue
offset, copied by ``broker.features.retry.model``'s rules, and stored through the send path (delayed
through the schedule topic when retried). The retry and dead-letter topics are created, with one
queue each, by a replicated topic entry before their first message. Owns nothing replicated.

The canary ``retry_count_lost`` (tests only) counts reconsumes in the leader's memory instead of
reading the replicated ``RECONSUME_TIME``: a new leader starts from 0 again, so a message
retried across a leader change is retried too often, with a count that goes back, which the
retry checker (``chaos.live.checkers.retry``) must catch.
"""

from __future__ import annotations

from typing import Any, Protocol

from broker.core.entries import TopicPut
from broker.features.host import BrokerHost
from broker.features.retry.model import (
    DLQ_QUEUES,
    RECONSUME_TIME,
    RETRY_QUEUES,
    dlq_topic,
    resent_from_dlq,
    retry_topic,
    send_back,
)
from protocol.broker_kinds import SendRefusedError, message_id, offset_msg_id
from protocol.errors import DLedgerError
from protocol.topics import PERM_RW

_LOCAL_COUNTS_MAX = 100_000  # the canary's table, bounded


class SendSubmitter(Protocol):
    async def submit(self, topic: str, queue_id: int, raw: list[Any]) -> list[Any]:
        """Store messages on the broker's own account, as any send (``broker.api.sendpath``)."""
        ...


class RetryHost(BrokerHost, Protocol):
    @property
    def sends(self) -> SendSubmitter: ...


class RetryService:
    def __init__(self, host: RetryHost) -> None:
        self.host = host
        self.sent_back = 0  # send-backs this node stored as leader (for status)
        self.dead = 0
        self._count_lost = "retry_count_lost" in host.config.canaries
        self._local_counts: dict[str, int] = {}  # the canary's: original key -> send-backs
        self._local_term = -1

    async def send_back(self, group: str, topic: str, queue_id: int, offset: int,
                        delay_level: int, max_reconsume_times: int) -> list[Any]:
        """SEND_BACK: [status, the topic it went to, its reconsume times, dead?]."""
        self.host.require_leader()
        await self.host.node.read_barrier()  # every message a replica served is applied here
        m, msg_id = self._stored(topic, queue_id, offset)
        if self._count_lost:
            m = self._canary_local_count(group, m)
        back = send_back(group, m, topic, msg_id, delay_level, max_reconsume_times)
        await self._ensure(back.topic, DLQ_QUEUES if back.dead else RETRY_QUEUES)
        answer = await self.host.sends.submit(back.topic, 0, [back.message])
        if back.dead:
            self.dead += 1
        else:
            self.sent_back += 1
        return [answer[0], back.topic, back.reconsume_times, back.dead]

    async def resend_dead_letter(self, group: str, offset: int) -> list[Any]:
        """DLQ_RESEND: the dead letter at ``offset`` of ``%DLQ%<group>`` into its retry topic."""
        self.host.require_leader()
        await self.host.node.read_barrier()
        m, msg_id = self._stored(dlq_topic(group), 0, offset)
        target = retry_topic(group)
        await self._ensure(target, RETRY_QUEUES)
        answer = await self.host.sends.submit(target, 0, [resent_from_dlq(m, msg_id)])
        return [answer[0], target]

    def _canary_local_count(self, group: str, m: list[Any]) -> list[Any]:
        """THE CANARY ``retry_count_lost``: the message as if its RECONSUME_TIME were this
        leader's own count of its send-backs (forgotten at a leader change), not the
        replicated one."""
        core = self.host.node.core
        term = core.term if core is not None else 0
        if term != self._local_term or len(self._local_counts) > _LOCAL_COUNTS_MAX:
            self._local_counts, self._local_term = {}, term  # a new leader knows no count
        props = m[4]
        key = group + "/" + message_id(m[3], props)
        count = self._local_counts.get(key, 0)
        self._local_counts[key] = count + 1
        kept = [[n, v] for n, v in props if n != RECONSUME_TIME] + [[RECONSUME_TIME, str(count)]]
        return [*m[:4], kept, *m[5:]]

    def _stored(self, topic: str, queue_id: int, offset: int) -> tuple[list[Any], str]:
        units = self.host.state.units(topic, queue_id, offset, 1)
        if not units:
            raise SendRefusedError("MESSAGE_NOT_FOUND", f"{topic} queue {queue_id} has no "
                                   f"message at offset {offset}")
        unit = units[0]
        try:
            m = self.host.stored_message(unit.position, unit.slot)
        except DLedgerError as err:  # retention deleted it
            raise SendRefusedError("MESSAGE_NOT_FOUND", f"{topic}@{offset}: {err}") from err
        return list(m), offset_msg_id(self.host.group, unit.position, unit.slot)

    async def ensure_retry_topic(self, group: str) -> None:
        """``%RETRY%group`` created if it is not yet (leader only): a RocketMQ broker makes it
        when a clustering consumer of the group first heartbeats, so that the consumer's
        route lookup finds it before its first message is sent back."""
        await self._ensure(retry_topic(group), RETRY_QUEUES)

    async def _ensure(self, topic: str, queues: int) -> None:
        if topic not in self.host.state.topics:
            await self.host.leader_commit(TopicPut(topic, queues, queues, PERM_RW, system=True))

    def status(self) -> dict[str, int]:
        return {"sent_back_here": self.sent_back, "dead_lettered_here": self.dead}
