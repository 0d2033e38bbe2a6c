"""Topic configuration and naming rules (RocketMQ's): read/write queue counts, permission
(2 write, 4 read, 6 both), name characters and length, reserved system topics. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

from protocol.broker_errors import InvalidTopicError

PERM_WRITE = 2
PERM_READ = 4
PERM_RW = PERM_READ | PERM_WRITE
DEFAULT_QUEUES = 4  # per group, on auto-create (RocketMQ's default)
MAX_QUEUES = 1024
TOPIC_NAME_MAX_CHARS = 127
_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")

# RocketMQ's reserved topic names (its TopicValidator's system topics): the auto-create
# template, delay levels, transactions, trace, benchmark, self test, offset-moved events. No
# request may create, delete or send to one of these as a user topic.
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"  # delayed messages wait here (one queue, 0)
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"  # transactions' half messages (one queue, 0)
SYSTEM_TOPICS = frozenset({"TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest",
                           "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                           "RMQ_SYS_TRACE_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC",
                           "OFFSET_MOVED_EVENT"})
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"  # message trace records (``client.trace.records``)
# The reserved names a send may not use: the trace topic takes the tracing clients' sends (and
# is created by the first of them), as RocketMQ's trace topic does; it stays reserved for
# topic admin (no request creates or deletes it).
SEND_RESERVED_TOPICS = SYSTEM_TOPICS - {TRACE_TOPIC}
# The names the state machine refuses when it applies an entry. Entries already in a log were
# accepted under this set, and replaying them must reach the same state (a topic they created
# must not vanish on upgrade), so this set never grows: names reserved later are refused at the
# request, before anything is proposed (``SYSTEM_TOPICS``).
APPLY_RESERVED_TOPICS = frozenset({"SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC",
                                   "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TBW102"})
SYSTEM_PREFIXES = ("%RETRY%", "%DLQ%", "rmq_sys_")


@dataclass(frozen=True, slots=True)
class TopicConfig:
    name: str
    read_queues: int = DEFAULT_QUEUES
    write_queues: int = DEFAULT_QUEUES
    perm: int = PERM_RW

    @property
    def queues(self) -> int:
        """Physical queues: producers use [0, write_queues), consumers [0, read_queues)."""
        return max(self.read_queues, self.write_queues)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)


def is_system_topic(name: str, reserved: frozenset[str] = SYSTEM_TOPICS) -> bool:
    return name in reserved or name.startswith(SYSTEM_PREFIXES)


def validate_topic_name(name: object, allow_system: bool = False,
                        reserved: frozenset[str] = SYSTEM_TOPICS) -> str:
    if not isinstance(name, str):
        raise InvalidTopicError(f"a topic name is a string, not {type(name).__name__}")
    if not name:
        raise InvalidTopicError("the topic name is empty")
    if len(name) > TOPIC_NAME_MAX_CHARS:
        raise InvalidTopicError(f"topic name longer than {TOPIC_NAME_MAX_CHARS} characters")
    if not _NAME.match(name):
        raise InvalidTopicError(f"topic name {name!r} may only use letters, digits, %, |, _ and -")
    if not allow_system and is_system_topic(name, reserved):
        raise InvalidTopicError(f"{name!r} is a reserved system topic")
    return name


def validate_config(cfg: TopicConfig, allow_system: bool = False) -> TopicConfig:
    """The state machine's check of a topic config at apply (requests check names first, with
    every reserved name: see ``APPLY_RESERVED_TOPICS``)."""
    validate_topic_name(cfg.name, allow_system, APPLY_RESERVED_TOPICS)
    for what, n in (("read", cfg.read_queues), ("write", cfg.write_queues)):
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_QUEUES:
            raise InvalidTopicError(f"{what} queue count must be 0..{MAX_QUEUES}, not {n!r}")
    if cfg.perm not in (PERM_WRITE, PERM_READ, PERM_RW):
        raise InvalidTopicError(f"perm must be 2 (write), 4 (read) or 6 (both), not {cfg.perm!r}")
    return cfg
