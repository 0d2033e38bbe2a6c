"""Stamping a process's frames for ``bench.hops``. ``install(out_dir)`` wraps the frame codec
(``protocol.frames``: every frame encoded, every frame decoded) and a node's inline log sync
(``dledger.storage.flush.Flusher.sync_inline``: its start and its end), so that each appends
``[time.perf_counter_ns(), event, payload bytes, the payload's first 4 bytes in hex]`` to
``<out_dir>/<pid>.jsonl`` (300 at a time, and the rest at exit). ``perf_counter`` reads
CLOCK_MONOTONIC on Linux: one clock for every process of the box. About a microsecond a frame.

A tool's instrument: nothing in the broker imports it. The servers of a run load it through
``bench/hops/site/sitecustomize.py`` (on their ``PYTHONPATH``, with ``DLEDGER_HOPS_DIR`` set),
before any module of theirs is imported, so that the modules that import ``encode_frame`` by
name get the wrapped one; the tool's own process calls ``install`` before it imports the client.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from collections.abc import Callable
from typing import Any

HOPS_DIR_ENV = "DLEDGER_HOPS_DIR"
FLUSH_EVERY = 300

__all__ = ["HOPS_DIR_ENV", "flush_now", "install"]

_flushes: list[Callable[[], None]] = []  # the installed recorder's flush (one per process)


def install(out_dir: str) -> None:
    import protocol.frames as frames
    from dledger.storage.flush import Flusher

    rows: list[list[Any]] = []
    path = os.path.join(out_dir, f"{os.getpid()}.jsonl")
    clock = time.perf_counter_ns

    def flush() -> None:
        if rows:
            with open(path, "a", encoding="utf-8") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))
            rows.clear()

    def note(event: str, payload: bytes = b"") -> None:
        rows.append([clock(), event, len(payload), bytes(payload[:4]).hex()])
        if len(rows) >= FLUSH_EVERY:
            flush()

    atexit.register(flush)
    _flushes.append(flush)
    encode_frame = frames.encode_frame
    feed = frames.FrameDecoder.feed
    sync_inline = Flusher.sync_inline

    def encode_stamped(payload: bytes) -> bytes:
        note("out", payload)
        return encode_frame(payload)

    def feed_stamped(self: frames.FrameDecoder, data: bytes) -> list[bytes]:
        got = feed(self, data)
        for payload in got:
            note("in", payload)
        return got

    def sync_stamped(self: Flusher, spin: bool) -> None:
        note("sync0")
        sync_inline(self, spin)
        note("sync1")

    frames.encode_frame = encode_stamped
    frames.FrameDecoder.feed = feed_stamped  # type: ignore[method-assign]
    Flusher.sync_inline = sync_stamped  # type: ignore[method-assign]


def flush_now() -> None:
    """Write what this process has stamped so far (the tool reads its own before it exits)."""
    for flush in _flushes:
        flush()
