"""Test-wide setup.

Hypothesis is imported here, before any test starts a thread: CPython 3.11 can raise "AST
constructor recursion depth mismatch" when pytest's assertion rewriting compiles a lazily
imported plugin module while another thread compiles code at the same time.

Run in parallel (``make test``: pytest-xdist, with this file's scheduler), a module's tests stay
on one worker, since many share a module's cluster; but each live chaos run is a unit of its own,
so that they spread over the workers. The longest work is collected first, so that no worker is
left with a long run at the end: the container test (tests/deploy), the live chaos runs (their
canaries first), then the modules with tests marked ``slow`` (real processes), then the rest.

Every process a test starts shares one cluster credential (``$DLEDGER_CLUSTER_KEY``, set here).

A time-boxed test says how much it ran with the ``ran`` fixture: its lines travel with the
test's report (from any worker) and are printed together at the end of the run.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from typing import Any

import hypothesis
import hypothesis.internal.conjecture.providers
import pytest

from protocol.cluster_key import CLUSTER_KEY_ENV

# Every NameServer and broker a test starts shares one cluster credential, from the environment
# they inherit: registrations are signed as in a real cluster (tests of the credential itself
# give their own, or none).
os.environ.setdefault(CLUSTER_KEY_ENV, secrets.token_hex(32))

LIVE_CHAOS_PREFIX = "tests.chaos.test_chaos_"  # scenarios, tls, canaries, membership
LIVE_CHAOS_PATH = "tests/chaos/test_chaos_"
# The longest live runs, started first (a minute of faults, or a canary run to the end).
LONGEST_FIRST = ("test_membership_changes_under_kills_and_isolation", "test_seeded_bug_is_caught",
                 "test_the_grpc_canaries_are_caught")
# About a minute in one module, on one worker (an image built, a compose cluster of seven
# containers): started first, so that it never holds the suite's end.
FIRST_MODULES = ("tests.deploy.test_containers",)


def _module(item: pytest.Item) -> str:
    module = getattr(item, "module", None)
    return module.__name__ if module is not None else item.nodeid


def _is_live_chaos(item: pytest.Item) -> bool:
    return _module(item).startswith(LIVE_CHAOS_PREFIX) and item.get_closest_marker("slow") is not None


def _order(item: pytest.Item) -> int:
    if _module(item) in FIRST_MODULES:
        return -1
    if _is_live_chaos(item):
        return 0 if item.name.startswith(LONGEST_FIRST) else 1
    return 2 if item.get_closest_marker("slow") is not None else 3


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank: dict[str, int] = {}  # a module's items stay together: its rank is its longest item's
    for item in items:
        rank[_module(item)] = min(rank.get(_module(item), 3), _order(item))
    # (stable: within a rank, the files' own order)
    items.sort(key=lambda it: _order(it) if _is_live_chaos(it) else rank[_module(it)])


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The work units the workers take: a module's tests together (many share a module's
    cluster), but each test of a live chaos module on its own, in collection order. (xdist's
    ``loadgroup`` did not group: with pytest 9 the group it appends to a node id is lost, and
    every test went out alone, starting a module's cluster on each worker that ran one.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleOrRun(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return nodeid if path.startswith(LIVE_CHAOS_PATH) else path

    return ModuleOrRun(config, log)


@pytest.fixture
def ran(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """``ran(text)``: a line of how much this test ran, printed at the end of the run."""
    def say(text: str) -> None:
        request.node.user_properties.append(("ran", text))
    return say


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = [f"{report.nodeid}\n    " + str(value).replace("\n", "\n    ")
             for reports in terminalreporter.stats.values() for report in reports
             if getattr(report, "when", "") == "call"
             for key, value in getattr(report, "user_properties", ()) if key == "ran"]
    if lines:
        terminalreporter.section("how much the time-boxed tests ran")
        for line in lines:
            terminalreporter.write_line(line)


__all__ = ["hypothesis", "ran"]
