"""The node options a benchmark starts its servers with (``--busy-poll-us``, ``--quorum-first``),
shared by both benchmarks (``python -m bench.log`` and ``dledger bench``) so that they can run
the same way and each says in its output which way it ran.

The node's own defaults are read from its command line (``dledger.node_cli``), and only an option
that differs from them is passed: a benchmark left at the node's defaults follows them if they
change, and an option turned off where the node's default is on is passed as ``--no-...``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import click

from dledger.node.runtime import MAX_BUSY_POLL_US
from dledger.node_cli import node_config, node_options

F = TypeVar("F", bound=Callable[..., object])


def _node_defaults() -> tuple[int, bool]:
    """``--busy-poll-us`` and ``--quorum-first`` as a node started without them has them: its
    command line parsed with only the required options."""
    @click.command()
    @node_options
    def probe(**_: object) -> None:
        return None
    argv = ["--group", "g", "--id", "n0", "--peers", "n0=127.0.0.1:1", "--data-dir", "."]
    with probe.make_context("probe", argv) as ctx:
        config = node_config(ctx.params)
    return config.busy_poll_us, config.quorum_first


NODE_BUSY_POLL_US, NODE_QUORUM_FIRST = _node_defaults()


@dataclass(frozen=True)
class NodeFlags:
    busy_poll_us: int = NODE_BUSY_POLL_US  # 0: no busy polling
    quorum_first: bool = NODE_QUORUM_FIRST

    def __post_init__(self) -> None:
        if not 0 <= self.busy_poll_us <= MAX_BUSY_POLL_US:
            raise ValueError(f"busy_poll_us must be within 0..{MAX_BUSY_POLL_US}, "
                             f"not {self.busy_poll_us}")

    def args(self, node: tuple[int, bool] = (NODE_BUSY_POLL_US, NODE_QUORUM_FIRST)) -> tuple[str, ...]:
        """The node command-line arguments; none for an option left at the node's default
        (``node``: its ``--busy-poll-us`` and ``--quorum-first``)."""
        busy = ("--busy-poll-us", str(self.busy_poll_us)) if self.busy_poll_us != node[0] else ()
        quorum = (() if self.quorum_first == node[1]
                  else ("--quorum-first",) if self.quorum_first else ("--no-quorum-first",))
        return busy + quorum

    def describe(self) -> str:
        """One line for a report: every option, whether it was given or left at its default."""
        given = " ".join(self.args()) or "none (the node's defaults)"
        return (f"node options: {given}; busy polling {self.busy_poll_us} us, quorum-first "
                f"{'on' if self.quorum_first else 'off'}")

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
