"""Message sizes as the broker counts them, and the explicit splitting of a long list of
messages into batches that fit (RocketMQ's ``ListSplitter`` example): ``send_batch`` itself
refuses a batch over the limit instead of splitting it behind the caller's back."""

from __future__ import annotations

from collections.abc import Sequence

from client.types import Message
from protocol import broker_kinds as bp

UNIQUE_KEY_CHARS = 32  # the producer's unique keys (``producer._UniqueKeys``): counted too
_KEY_STAND_IN = "0" * UNIQUE_KEY_CHARS


def message_bytes(m: Message) -> int:
    """``m``'s size against the broker's maximum (``--max-message-bytes``, 4 MiB by default):
    topic, body, tags, keys, properties and the unique key the producer adds (RocketMQ keeps
    all of them as properties), each string in UTF-8 bytes, and 20 bytes of overhead."""
    return bp.message_bytes(m.topic, m.body, m.tags, m.keys, _KEY_STAND_IN, m.properties)


def split_batch(messages: Sequence[Message],
                max_bytes: int = bp.MAX_MESSAGE_BYTES) -> list[list[Message]]:
    """Consecutive runs of ``messages`` of at most ``max_bytes`` in total (``message_bytes``),
    each one ``send_batch`` can store, in order. A message larger than ``max_bytes`` by itself
    makes a run of its own (which the broker will refuse), as RocketMQ's splitter does."""
    out: list[list[Message]] = []
    total = 0
    for m in messages:
        n = message_bytes(m)
        if not out or total + n > max_bytes:
            out.append([])
            total = 0
        out[-1].append(m)
        total += n
    return out
