"""A node's event trace: one JSON object per line, appended and flushed at each event, kept
across restarts (docs/testing.md). Written by the runtime when asked (tests and chaos runs),
read by ``chaos.traces`` to check Raft's invariants on real processes.

Events: ``start`` (a process life begins), ``role`` (term, role), ``vote`` (term, voted_for, once
it is durable), ``commit`` (index, term and crc32 of the entry at the new commit index).
"""

from __future__ import annotations

import json
import os
import time
import zlib
from typing import Any, TextIO

from dledger.raft.types import Entry, HardState, Status


class NodeTrace:
    def __init__(self, path: str, node_id: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._f: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._node = node_id
        self._role: tuple[int, str] | None = None
        self._vote: tuple[int, str | None] | None = None
        self.write("start")

    def write(self, ev: str, **fields: Any) -> None:
        self._f.write(json.dumps({"node": self._node, "t": time.time_ns(), "ev": ev, **fields})
                      + "\n")
        self._f.flush()

    def observe(self, status: Status) -> None:
        role = (status.term, status.role.value)
        if role != self._role:
            self._role = role
            self.write("role", term=status.term, role=status.role.value)

    def persisted(self, hs: HardState) -> None:
        if hs.voted_for is not None and (hs.term, hs.voted_for) != self._vote:
            self._vote = (hs.term, hs.voted_for)
            self.write("vote", term=hs.term, voted_for=hs.voted_for)

    def committed(self, last: Entry) -> None:
        self.write("commit", index=last.index, term=last.term, crc=zlib.crc32(last.data))

    def close(self) -> None:
        self._f.close()
