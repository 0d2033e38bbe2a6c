"""Ports handed out for servers on this machine, remembered across processes for a while, so
that two pickers (``dledger.localcluster.free_ports``) in different processes never hand out
the same port: a port is checked free and released, and its server binds it only a moment (or,
for a node that is restarted on its port, seconds) later; in between, another process's check
found it free too, and one of the two servers failed with "address already in use" (a CI run
of four test workers did).

A claim is a line ``<port> <expiry, epoch seconds>`` in one file of the temp directory per user
(``claims_path``), read and rewritten under an exclusive ``flock``; claims past their expiry
are dropped on the next write. Nothing here is needed for correctness: a file that cannot be
opened or locked leaves the picker as it was (it chooses as if nothing were claimed)."""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Callable, Iterable

CLAIM_TTL_S = 900.0  # longer than any test's cluster keeps a node down before its restart

__all__ = ["CLAIM_TTL_S", "claims_path", "with_claims"]


def claims_path() -> str:
    return os.path.join(tempfile.gettempdir(), f"dledger-port-claims-{os.getuid()}")


def _parse(text: str, now: float) -> dict[int, float]:
    live: dict[int, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue  # (a torn or foreign line: ignored, and dropped at the rewrite)
        try:
            port, expiry = int(parts[0]), float(parts[1])
        except ValueError:
            continue
        if expiry > now:
            live[port] = max(expiry, live.get(port, 0.0))
    return live


def with_claims(choose: Callable[[set[int]], Iterable[int]], path: str | None = None,
                ttl_s: float = CLAIM_TTL_S) -> list[int]:
    """``choose(claimed)`` (the ports others claimed and that have not expired) picks ports,
    which are then claimed for ``ttl_s``; the whole under the file's lock, so that no other
    process picks in between. Without a usable file, ``choose(set())`` alone."""
    path = path or claims_path()
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return list(choose(set()))
    with os.fdopen(fd, "r+", encoding="ascii", errors="replace") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
        except OSError:
            return list(choose(set()))
        now = time.time()
        live = _parse(f.read(), now)
        picked = list(choose(set(live)))
        for port in picked:
            live[port] = now + ttl_s
        f.seek(0)
        f.truncate()
        f.write("".join(f"{p} {e:.0f}\n" for p, e in sorted(live.items())))
        f.flush()
        return picked  # (closing the file releases the lock)
