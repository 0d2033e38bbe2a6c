"""Log retention and the consume queues: once old segments are deleted, a queue's min offset moves
past the messages they held; a pull below it is answered OFFSET_OUT_OF_RANGE with the new min,
and pulls from the min go on. One in-process broker node (a group of one), retention by entry
count (tests/log/test_retention.py has the other rules, with the same scenario)."""

from __future__ import annotations

from pathlib import Path

from tests.log.test_retention import retained_on_a_node


def test_retention_moves_a_queues_min_offset(tmp_path: Path) -> None:
    retained_on_a_node(tmp_path, retention_entries=20)
