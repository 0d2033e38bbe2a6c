"""The life of a producer or consumer: new -> started -> closed, and the named error of a call
made out of turn (before ``start()``: ``ClientNotStartedError``; after ``close()``:
``ClientClosedError``), so that every client of the library says the same, at once, instead of
failing later on a closed connection. Owns nothing else."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from client.errors import ClientClosedError, ClientNotStartedError

NEW, STARTING, STARTED, CLOSED = "new", "starting", "started", "closed"


class Lifecycle:
    def __init__(self, what: str) -> None:
        self.what = what  # how errors name the client, e.g. "Producer"
        self.state = NEW

    def check(self) -> None:
        """Raise the named error unless started (and not closed)."""
        if self.state == STARTED:
            return
        if self.state == CLOSED:
            raise ClientClosedError(f"{self.what} is closed")
        raise ClientNotStartedError(f"{self.what} is not started: call (await) start() first, "
                                    f"or use it in a with block")

    async def start(self, work: Callable[[], Awaitable[object]]) -> None:
        """start()'s body: run ``work`` once; a failed start leaves the client new (retry it)."""
        if not self.begin_start():
            return
        ok = False
        try:
            await work()
            ok = True
        finally:
            self.end_start(ok)

    def begin_start(self) -> bool:
        """At the top of start(): True if the caller must start the client now; False if it is
        started (or starting) already: start() is then a no-op. A closed client cannot restart."""
        if self.state == CLOSED:
            raise ClientClosedError(f"{self.what} is closed: create a new one")
        if self.state != NEW:
            return False
        self.state = STARTING
        return True

    def end_start(self, ok: bool) -> None:
        """After start()'s work: started, or back to new when it failed (start() may be retried)."""
        if self.state == STARTING:
            self.state = STARTED if ok else NEW

    def close(self) -> bool:
        """At the top of close(): True the first time, for a client that was started (there is
        something to release); closing again, or closing a client never started, does nothing."""
        was = self.state
        self.state = CLOSED
        return was in (STARTING, STARTED)
