"""Fixed ports for servers that restart on the same port come from below the ephemeral range.

The CI failure this guards against: a broker's port, chosen free and released, was taken by a
socket binding port 0 (a proxy listener) before the broker bound it. The kernel never hands out
a port below its ephemeral range to such a socket.
"""

from __future__ import annotations

import socket

from dledger.localcluster import _ephemeral_range, free_ports


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
