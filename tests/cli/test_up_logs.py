"""The logs of ``dledger up`` after an incident (issue 34, the bar of item 1): after a leader kill
and a restart, the killed node's and the new leader's ``DATA_DIR/*.log`` name the election and
the new term that ``dledger status`` reports, at the default level, and no log holds a secret.
On the way, with the old leader dead, the new leader's status shows it unreachable since the last
time a member heard from it, not "never" (item 4)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from cli.status import status_table
from protocol.cluster_key import KEY_FILE_NAME
from tests.cli.up_process import UpProcess

LOG_TIMEOUT_S = 30.0


def _wait_log_line(path: Path, pattern: str) -> re.Match[str]:
    """The last line of ``path`` matching ``pattern``, once there is one (the processes write
    their logs as they go)."""
    deadline = time.monotonic() + LOG_TIMEOUT_S
    while True:
        found = list(re.finditer(pattern, path.read_text(errors="replace")))
        if found:
            return found[-1]
        assert time.monotonic() < deadline, f"no {pattern!r} in {path}:\n{path.read_text()}"
        time.sleep(0.1)  # polling a file another process appends to


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_after_a_leader_kill_and_restart_the_logs_name_the_election_and_no_secret(
        tmp_path: Path) -> None:
    up = UpProcess(tmp_path / "d").ready()
    try:
        old = up.wait_health("ok")
        killed = old["leader"]
        res = up.node_cmd("kill", "a", killed)
        assert res.exit_code == 0, res.output
        deadline = time.monotonic() + 60
        while True:  # a new leader, the killed node unreachable
            _code, group = up.status()
            if group["leader"] not in (None, killed) or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # polling the cluster's view until it settles
        new_leader = group["leader"]
        assert new_leader not in (None, killed), group
        row = next(n for n in group["nodes"] if n["node"] == new_leader)["followers"][killed]
        assert row["last_contact_ticks"] == -1  # the new leader never heard it in its term
        assert row["reachable"] is False and row["last_heard_by"] in {"n0", "n1", "n2"} - {killed}
        assert isinstance(row["last_heard_ms"], int) and row["last_heard_ago_ms"] >= 0
        table = status_table([group])
        assert f"{killed}: " in table and "unreachable since " in table, table
        assert "never" not in table, table

        res = up.node_cmd("restart", "a", killed)
        assert res.exit_code == 0, res.output
        group = up.wait_health("ok")
        term, leader = group["term"], group["leader"]
        assert term > old["term"] and leader is not None

        killed_log = up.data_dir / f"a-{killed}.log"
        leader_log = up.data_dir / f"a-{leader}.log"
        said = _wait_log_line(killed_log, r"INFO .* leader is (\S+), elected at term (\d+)")
        assert (said.group(1), int(said.group(2))) == (leader, term), said.group(0)
        won = _wait_log_line(leader_log, r"INFO .* leader is (\S+): this node won the election "
                                         r"at term (\d+)")
        assert (won.group(1), int(won.group(2))) == (leader, term), won.group(0)
        stood = _wait_log_line(leader_log, r"election at term (\d+): this node stands for leader")
        assert int(stood.group(1)) == term
        assert "dledger-broker" in killed_log.read_text() and "starting" in killed_log.read_text()

        key = (up.data_dir / KEY_FILE_NAME).read_text().strip()
        assert len(key) >= 32
        logs = sorted(up.data_dir.glob("*.log"))
        assert {p.name for p in logs} >= {"namesrv.log", "a-n0.log", "a-n1.log", "a-n2.log"}
        for path in logs:
            text = path.read_text(errors="replace")
            assert key not in text and key[:16] not in text, path
            assert "PRIVATE KEY" not in text, path
            # quiet in steady state: no line per heartbeat (10 a second) or registration refresh
            assert len(text.splitlines()) < 40, text
        assert str(up.data_dir / KEY_FILE_NAME) in (up.data_dir / "namesrv.log").read_text()
    finally:
        up.cleanup()
