"""Live chaos with RocketMQ 4.x clients (S18): two C++ producers (``chaos.live.remoting``, the
clients' environment of ``make clients``) send through the brokers' remoting endpoints beside
two of ours while the leader is killed again and again; the offline checker finds no
acknowledged send lost and none stored twice. Its canary (``remoting_ack_early``: the endpoint
answers before the message is stored) is caught by the same checker
(``tests/chaos/test_chaos_canaries.py``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from chaos.live.remoting import CPP_PYTHON
from tests.chaos.live_runs import FEATURE_CANARY_DURATION_S, run_live
from tests.remoting.clients import cpp_python

pytestmark = pytest.mark.slow


def test_4x_producers_lose_nothing_while_the_leader_is_killed(
        tmp_path: Path, ran: Callable[[str], None]) -> None:
    assert cpp_python() == str(CPP_PYTHON)  # (skipped, or failed in CI, without the client)
    run = run_live(tmp_path, "S18", duration_s=FEATURE_CANARY_DURATION_S, ran=ran)
    assert run["verdict"] == "PASS", run["violations"][:5]
    assert run["faults"].get("kill", 0) >= 1, run["faults"]
    assert run["remoting"]["acked"] > 0, run["remoting"]  # the 4.x producers took part
