"""Fixed ports for servers that restart on the same port come from below the ephemeral range.

The CI failure this guards against: a broker's port, chosen free and released, was taken by a
socket binding port 0 (a proxy listener) before the broker bound it. The kernel never hands out
a port below its ephemeral range to such a socket.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from dledger.localcluster import _ephemeral_range, free_ports
from dledger.port_claims import with_claims


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low, _ = _ephemeral_range()
    ports = free_ports(16)
    assert len(set(ports)) == 16
    assert all(10_000 <= p < low for p in ports), ports
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_port_in_use_is_not_chosen() -> None:
    held = []
    try:
        for p in free_ports(8):
            s = socket.socket()
            s.bind(("127.0.0.1", p))
            s.listen()
            held.append(s)
        taken = {s.getsockname()[1] for s in held}
        for _ in range(20):
            assert not taken & set(free_ports(8))
    finally:
        for s in held:
            s.close()


def test_ports_handed_out_are_claimed_across_calls_and_processes(tmp_path: Path) -> None:
    """Two pickers (here two calls, and a picker in another process) never hand out one port,
    even with every socket closed between them: the claims file remembers the first's."""
    claims = str(tmp_path / "claims")
    first = free_ports(200, claims=claims)
    code = ("import json, sys; from dledger.localcluster import free_ports; "
            f"print(json.dumps(free_ports(200, claims={claims!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=Path(__file__).resolve().parents[2], check=True)
    second = json.loads(out.stdout)
    assert len(set(first)) == 200 and len(set(second)) == 200
    assert not set(first) & set(second)
    assert len(Path(claims).read_text().splitlines()) == 400


def test_expired_and_torn_claims_are_dropped(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    claims.write_text(f"12345 {time.time() - 1:.0f}\ngarbage\n23456\n23457 {time.time() + 600:.0f}\n")
    assert with_claims(lambda claimed: [] if claimed == {23457} else [1], str(claims)) == []
    assert claims.read_text().split()[0] == "23457" and len(claims.read_text().splitlines()) == 1


def test_an_unusable_claims_file_leaves_the_choice_alone(tmp_path: Path) -> None:
    missing_dir = str(tmp_path / "no" / "such" / "dir" / "claims")
    assert with_claims(lambda claimed: sorted(claimed) or [7], missing_dir) == [7]
