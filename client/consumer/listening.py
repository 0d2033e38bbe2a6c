"""How a push consumer runs its listener on a batch (``client.consumer.push``, and the orderly
consumer one message at a time): a plain or async listener; SUCCESS is a success, anything else
(LATER, SUSPEND, None, an exception, or an async listener that does not answer within the
consume timeout) is a failure to retry, as RocketMQ's."""

from __future__ import annotations

import asyncio
import inspect
import logging

from client.types import ConsumeStatus, Listener, ReceivedMessage

log = logging.getLogger("client.consumer.push")


async def call_listener(listener: Listener, batch: list[ReceivedMessage], group: str,
                        timeout_s: float) -> ConsumeStatus:
    """SUCCESS or LATER: what ``listener`` made of ``batch``."""
    try:
        out = listener(batch)
        if inspect.isawaitable(out):
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result when the
            # awaitable ends in the same loop turn as a cancel of this task, and the cancel is
            # lost (close() then waited for ever on an orderly queue's task)
            async with asyncio.timeout(timeout_s):
                out = await out
    except TimeoutError:
        log.warning("listener of %s did not answer in %.0f s: counted as a failure", group,
                    timeout_s)
        return ConsumeStatus.LATER
    except Exception:  # a listener's exception means "later", as RocketMQ's
        log.exception("listener of %s failed; the messages will be redelivered", group)
        return ConsumeStatus.LATER
    return out if out is ConsumeStatus.SUCCESS else ConsumeStatus.LATER  # SUSPEND too
