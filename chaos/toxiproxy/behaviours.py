"""What each toxic type does to the chunks of one link (docs/toxiproxy.md).

Owns one coroutine per type. Each takes chunks from its stage one at a time, in order, and
returns once it has passed end-of-stream on or ended the stream itself. A behaviour must keep
``stage.held`` equal to what it has not yet passed on, so that a live update or removal (which
cancels it) loses and duplicates nothing. Behaviours never touch sockets, except ``reset_peer``,
which asks the connection to reset.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from chaos.toxiproxy.flow import Chunk, now_s

if TYPE_CHECKING:
    from chaos.toxiproxy.stage import Stage

BANDWIDTH_PIECE_INTERVAL_S = 0.1
OVERSHOOT_CARRY_MAX_S = 1.0


async def noop(stage: Stage) -> None:
    while True:
        chunk = await stage.take()
        await stage.forward(chunk)
        if chunk.eof:
            return


async def latency(stage: Stage) -> None:
    """Release each chunk at its arrival time + delay, so a steady stream keeps its rate."""
    latency_ms, jitter_ms = stage.attributes["latency"], stage.attributes["jitter"]
    while True:
        chunk = await stage.take()
        if chunk.eof:
            await stage.forward(chunk)
            return
        delay_ms = latency_ms
        if jitter_ms > 0:
            delay_ms += stage.rng.randrange(-jitter_ms, jitter_ms)
        wait_s = chunk.stamp_s + delay_ms / 1000 - now_s()
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        # Re-stamp on release so that several latency toxics add up.
        await stage.forward(Chunk(chunk.data, now_s()))


async def _sleep_owed(owed_s: float, overshoot_s: float) -> float:
    """Sleep ``owed_s`` less what earlier sleeps overshot; return the new overshoot."""
    sleep_s = owed_s - overshoot_s
    if sleep_s <= 0:
        return -sleep_s
    started_s = now_s()
    await asyncio.sleep(sleep_s)
    return min(max(0.0, now_s() - started_s - sleep_s), OVERSHOOT_CARRY_MAX_S)


async def bandwidth(stage: Stage) -> None:
    """``rate`` KB/s: each byte costs 1/rate ms; idle time earns no credit. 0 stalls."""
    rate = stage.attributes["rate"]  # bytes per millisecond
    overshoot_s = 0.0
    while True:
        chunk = await stage.take()
        if chunk.data is None:  # end of stream
            await stage.forward(chunk)
            return
        if rate == 0:
            # Held until the toxic is updated or removed: that cancels this wait and the stage
            # hands the held chunk on (docs/toxiproxy.md). No deadline on purpose.
            await asyncio.Event().wait()
        data, piece_bytes = chunk.data, rate * 100
        while len(data) > piece_bytes:
            overshoot_s = await _sleep_owed(BANDWIDTH_PIECE_INTERVAL_S, overshoot_s)
            await stage.forward_piece(data[:piece_bytes], data[piece_bytes:], chunk.stamp_s)
            data = data[piece_bytes:]
        overshoot_s = await _sleep_owed(len(data) / rate / 1000, overshoot_s)
        await stage.forward(Chunk(data, chunk.stamp_s))


async def slow_close(stage: Stage) -> None:
    delay_ms = stage.attributes["delay"]
    while True:
        chunk = await stage.take()
        if chunk.eof and delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)
        await stage.forward(chunk)
        if chunk.eof:
            return


async def timeout(stage: Stage) -> None:
    """Discard everything; end the stream after ``timeout`` ms without a chunk (0: never)."""
    timeout_ms = stage.attributes["timeout"]
    idle_s = timeout_ms / 1000 if timeout_ms > 0 else None
    while True:
        chunk = await stage.take(idle_s)
        if chunk is None:
            await stage.forward(Chunk(None, now_s()))
            return
        if chunk.eof:
            await stage.forward(chunk)
            return
        stage.drop()


async def reset_peer(stage: Stage) -> None:
    """On the first chunk (or EOF): wait ``timeout`` ms, drop it and reset both sockets."""
    await stage.take()
    timeout_ms = stage.attributes["timeout"]
    if timeout_ms > 0:
        await asyncio.sleep(timeout_ms / 1000)
    stage.drop()
    stage.link.connection.reset()


def slice_sizes(length: int, average: int, variation: int, rng: random.Random) -> list[int]:
    """Piece lengths: split near the midpoint until a piece is <= average + variation."""
    sizes: list[int] = []
    pending = [length]
    while pending:
        size = pending.pop()
        if size <= average + variation:
            sizes.append(size)
            continue
        middle = size // 2
        if variation > 0:
            middle += rng.randrange(-variation, variation)
        middle = min(max(middle, 1), size - 1)
        pending.append(size - middle)  # popped after the first half: order is kept
        pending.append(middle)
    return sizes


async def slicer(stage: Stage) -> None:
    average = stage.attributes["average_size"]
    variation = stage.attributes["size_variation"]
    delay_s = max(0, stage.attributes["delay"]) / 1_000_000
    while True:
        chunk = await stage.take()
        if chunk.data is None:  # end of stream
            await stage.forward(chunk)
            return
        data = chunk.data
        for size in slice_sizes(len(data), average, variation, stage.rng):
            await stage.forward_piece(data[:size], data[size:], chunk.stamp_s)
            data = data[size:]
            if delay_s > 0:
                await asyncio.sleep(delay_s)


async def limit_data(stage: Stage) -> None:
    """Forward up to ``bytes`` in total on this link (count survives restarts), then close."""
    limit_bytes = stage.attributes["bytes"]
    while True:
        chunk = await stage.take()
        if chunk.data is None:  # end of stream
            await stage.forward(chunk)
            return
        sent_bytes = stage.state.get("sent_bytes", 0)
        remaining_bytes = limit_bytes - sent_bytes
        if remaining_bytes > 0:
            piece = chunk.data[:remaining_bytes]
            await stage.forward(Chunk(piece, chunk.stamp_s))
            stage.state["sent_bytes"] = sent_bytes + len(piece)
            if len(piece) < remaining_bytes:
                continue
        stage.drop()
        await stage.forward(Chunk(None, now_s()))
        return


BEHAVIOURS: dict[str, Callable[[Stage], Awaitable[None]]] = {
    "noop": noop,
    "latency": latency,
    "bandwidth": bandwidth,
    "slow_close": slow_close,
    "timeout": timeout,
    "reset_peer": reset_peer,
    "slicer": slicer,
    "limit_data": limit_data,
}

__all__ = ["BEHAVIOURS", "slice_sizes"]
