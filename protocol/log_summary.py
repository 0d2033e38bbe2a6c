"""Rate-limited log lines for events that may come in floods (``EventSummary``): a server's client
connection errors, a node's slow fsyncs, refused status reads. The first event after a quiet
period is logged at once; the ones after it, until ``period_s`` has passed, are counted and told
in one line when the period ends: at most one line per period, however many events, each line
with the counts by kind, how many distinct sources, the worst value if the events carry one,
and the last event's detail.

``CLIENT_CONNECTION_ERRORS`` is the process's summary of errors on server-side client
connections (``protocol.framed``: bad frames, connections refused or evicted by the listener's
limits, connections lost on an error; and the front ends' own): one per process, whatever the
listener. Owns only counting and the lines; the callers decide what is an event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

__all__ = ["CLIENT_CONNECTION_ERRORS", "PERIOD_S_DEFAULT", "EventSummary"]

PERIOD_S_DEFAULT = 10.0
SOURCES_MAX = 1024  # distinct sources remembered per period (beyond: counted as "1024+")
DETAIL_CHARS_MAX = 200


class EventSummary:
    """Counts events of one sort and logs at most one line per ``period_s`` (see the module).

    ``note`` is cheap and never raises. The line at the end of a period is written by a timer
    of the running event loop; without one (a plain thread) it waits for the next ``note`` or
    ``flush``. ``clock`` (monotonic seconds) is injectable for tests."""

    def __init__(self, logger: logging.Logger, what: str, *, period_s: float = PERIOD_S_DEFAULT,
                 level: int = logging.WARNING, clock: Callable[[], float] = time.monotonic,
                 worst: Callable[[float], str] | None = None) -> None:
        if period_s <= 0:
            raise ValueError("period_s must be positive")
        self.logger = logger
        self.what = what
        self.period_s = period_s
        self.level = level
        self._clock = clock
        self._worst_text = worst  # how the worst value reads ("slowest 1.234 s"), if any
        self._counts: Counter[str] = Counter()
        self._sources: set[str] = set()
        self._worst: float | None = None
        self._last = ""
        self._first_at = 0.0  # when the first event of this line came
        self._quiet_until = float("-inf")  # no line before then: the last one was this recent
        self._timer: asyncio.TimerHandle | None = None
        self.lines = 0  # lines written (for tests and status)
        self.events = 0  # events noted, in all

    def note(self, kind: str, source: str = "", detail: object = "",
             value: float | None = None) -> None:
        """One event of ``kind`` (e.g. "bad frame"), from ``source`` (e.g. a client's host),
        ``detail`` the last one's text, ``value`` a measure whose largest is told."""
        now = self._clock()
        if not self._counts:
            self._first_at = now
        self._counts[kind] += 1
        self.events += 1
        if source and len(self._sources) < SOURCES_MAX:
            self._sources.add(source)
        if value is not None and (self._worst is None or value > self._worst):
            self._worst = value
        if detail:
            self._last = (f"{source}: {detail}" if source else str(detail))[:DETAIL_CHARS_MAX]
        if now >= self._quiet_until:
            self.flush()
        elif self._timer is None:
            self._arm(self._quiet_until - now)

    @property
    def pending(self) -> int:
        """Events counted and not written yet (the next line's)."""
        return sum(self._counts.values())

    def flush(self) -> None:
        """Write the line of what was counted, if anything was; the next line waits a period."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._counts:
            return
        now = self._clock()
        self.logger.log(self.level, "%s", self._line(now),
                        extra={"events": sum(self._counts.values())})
        self.lines += 1
        self._counts.clear()
        self._sources.clear()
        self._worst = None
        self._last = ""
        self._quiet_until = now + self.period_s

    def _line(self, now: float) -> str:
        total = sum(self._counts.values())
        text = f"{self.what}: {total}"
        if total > 1:
            text += f" in the last {max(1, round(now - self._first_at))} s"
        text += " (" + ", ".join(f"{k} {n}" for k, n in self._counts.most_common()) + ")"
        if self._sources:
            count = len(self._sources)
            more = "+" if count >= SOURCES_MAX else ""
            text += f" from {count}{more} {'source' if count == 1 else 'sources'}"
        if self._worst is not None and self._worst_text is not None:
            text += f"; {self._worst_text(self._worst)}"
        if self._last:
            text += f"; last: {self._last}"
        if self.lines == 0:
            text += f" (at most one such line per {self.period_s:g} s)"
        return text

    def _arm(self, delay_s: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop here: the next note or flush writes it
        self._timer = loop.call_later(max(0.0, delay_s), self.flush)


CLIENT_CONNECTION_ERRORS = EventSummary(logging.getLogger("protocol.connections"),
                                        "client connection errors")
