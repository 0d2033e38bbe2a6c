"""Structured logs (``dledger.logfmt``, ``--log-format json|text``): one event per line, stamped with
the group, node and the term current when it was logged; a real node's leader change logged so."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger import logfmt
from dledger.localcluster import LocalCluster


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """The root logger configured by ``logfmt``, its handler writing to a buffer."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    buf = io.StringIO()
    yield buf
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in saved[0]:
        root.addHandler(h)
    root.setLevel(saved[1])
    logfmt.bind_context(None)


def _configure(buf: io.StringIO, fmt: str) -> None:
    logfmt.configure(fmt, "INFO")
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(buf)


def test_json_lines_carry_the_context_read_when_logged(captured: io.StringIO) -> None:
    _configure(captured, "json")
    term = [3]
    logfmt.bind_context(lambda: {"group": "a", "node": "n1", "term": term[0]})
    log = logging.getLogger("dledger.test")
    log.info("first %s", "event", extra={"peer": "n2", "obj": object()})
    term[0] = 4
    log.warning("multi\nline")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    log.debug("below the level")
    lines = captured.getvalue().splitlines()
    assert len(lines) == 3  # one per event, the multi-line message and the traceback included
    first, second, third = (json.loads(line) for line in lines)
    assert first["msg"] == "first event" and first["level"] == "INFO"
    assert (first["group"], first["node"], first["term"]) == ("a", "n1", 3)
    assert first["peer"] == "n2" and "obj" not in first  # only plain extra values
    assert first["logger"] == "dledger.test" and first["ts"].endswith("Z")
    assert second["term"] == 4 and second["msg"] == "multi\nline"
    assert "ValueError: boom" in third["exc"]


def test_text_lines_put_the_context_in_brackets_and_a_failing_context_is_left_out(
        captured: io.StringIO) -> None:
    _configure(captured, "text")
    logfmt.bind_context(lambda: {"group": "a", "node": "n0", "term": 7})
    logging.getLogger("dledger.test").warning("hello")
    assert "[group=a node=n0 term=7] hello" in captured.getvalue()

    def broken() -> dict[str, object]:
        raise RuntimeError("no node yet")

    logfmt.bind_context(broken)
    logging.getLogger("dledger.test").warning("still logged")
    assert "[] still logged" in captured.getvalue()


def test_an_unknown_format_is_a_named_error() -> None:
    with pytest.raises(ValueError, match="--log-format"):
        logfmt.configure("xml")


@pytest.mark.slow
def test_a_node_logs_its_leader_changes_as_json_lines(tmp_path: Path) -> None:
    with LocalCluster(str(tmp_path), size=3, tick_ms=50,
                      extra_args=("--log-format", "json", "--log-level", "INFO")) as cluster:
        deadline = time.monotonic() + 20
        events: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            events = [json.loads(line) for line in cluster.log_of_last_start("n0").splitlines()
                      if line.strip()]
            if any(str(e["msg"]).startswith("leader is ") for e in events):
                break
            time.sleep(0.05)  # polling the log file until the event is written
        changes = [e for e in events if str(e["msg"]).startswith("leader is ")]
        assert changes, cluster.log_tail("n0")
        event = changes[0]
        assert event["group"] == "g" and event["node"] == "n0"
        assert isinstance(event["term"], int) and event["term"] >= 1
        assert event["leader"] in {"n0", "n1", "n2"} and event["level"] == "INFO"
