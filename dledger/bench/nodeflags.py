"""The node options a benchmark starts its servers with (``--busy-poll-us``, ``--quorum-first``),
shared by both benchmarks (``python -m dledger.bench`` and ``dledger bench``) so that they can run
the same way and each says in its output which way it ran."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

import click

from dledger.runtime import MAX_BUSY_POLL_US

F = TypeVar("F", bound=Callable[..., object])


@dataclass(frozen=True)
class NodeFlags:
    busy_poll_us: int = 0  # 0: no busy polling, the node's default
    quorum_first: bool = False  # the node's default

    def __post_init__(self) -> None:
        if not 0 <= self.busy_poll_us <= MAX_BUSY_POLL_US:
            raise ValueError(f"busy_poll_us must be within 0..{MAX_BUSY_POLL_US}, "
                             f"not {self.busy_poll_us}")

    def args(self) -> tuple[str, ...]:
        """The node command-line arguments; none for an option left at the node's default."""
        return ((("--busy-poll-us", str(self.busy_poll_us)) if self.busy_poll_us else ())
                + (("--quorum-first",) if self.quorum_first else ()))

    def describe(self) -> str:
        """One line for a report: every option, whether it was given or left at its default."""
        given = " ".join(self.args()) or "none"
        return (f"node options: {given} (busy polling {self.busy_poll_us} us, quorum-first "
                f"{'on' if self.quorum_first else 'off'})")

    def prose(self) -> str:
        """What the options do, for a markdown report (the log benchmark's)."""
        busy = (f"`--busy-poll-us {self.busy_poll_us}` (a leader with at most 4 proposals awaiting "
                "commit, and a follower that just acknowledged entries when appends come that "
                "often, poll their sockets that long before they sleep, and a node polls for the "
                "fsync of a lone entry to end; the CPU column includes the polling)"
                if self.busy_poll_us else "no busy polling (`--busy-poll-us 0`)")
        quorum = ("`--quorum-first` (a new entry goes at once to one follower, the one a commit "
                  "needs; the other gets entries in batches of 1024 and at every 100 ms heartbeat)"
                  if self.quorum_first else
                  "without `--quorum-first` (every follower gets each new entry at once)")
        return f"{busy}, and {quorum}"


def node_flag_options(busy_poll_us: int, quorum_first: bool) -> Callable[[F], F]:
    """``--busy-poll-us`` and ``--quorum-first/--no-quorum-first`` with these defaults (the
    benchmark's, which need not be the node's)."""
    def decorate(f: F) -> F:
        f = click.option("--quorum-first/--no-quorum-first", default=quorum_first, show_default=True,
                         help="Start the servers with --quorum-first (or without).")(f)
        return click.option("--busy-poll-us", type=click.IntRange(0, MAX_BUSY_POLL_US),
                            default=busy_poll_us, show_default=True,
                            help="Start the servers with this --busy-poll-us (0: none).")(f)
    return decorate
