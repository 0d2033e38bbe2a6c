"""Structured logs (``dledger.logfmt``, ``--log-format json|text``): one event per line, stamped with
the group, node and the term current when it was logged; a real node's leader change logged so."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from broker.cli import start as broker_start
from dledger import logfmt
from dledger.localcluster import LocalCluster
from dledger.node_cli import setup_logging
from namesrv.cli import cli as namesrv_cli


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
        # the ready line on stdout carries them too (a container's stdout is all JSON lines)
        ready = cluster.servers["n0"].ready
        assert ready is not None and (ready["group"], ready["node"]) == ("g", "n0")
        assert isinstance(ready["term"], int)


def test_logs_go_to_stdout_when_asked_and_an_unknown_stream_is_a_named_error(
        captured: io.StringIO, capsys: pytest.CaptureFixture[str]) -> None:
    logfmt.configure("json", "INFO", "stdout")
    logging.getLogger("dledger.test").warning("to stdout")
    out, err = capsys.readouterr()
    assert json.loads(out)["msg"] == "to stdout" and err == ""
    with pytest.raises(ValueError, match="--log-stream is one of stderr, stdout, not 'syslog'"):
        logfmt.configure("json", "INFO", "syslog")


def test_a_nodes_first_lines_carry_group_node_and_a_null_term(
        captured: io.StringIO, capsys: pytest.CaptureFixture[str]) -> None:
    """Before the node has read its state (its start line, option errors), a line has the
    group and node and a term of null; text leaves the unknown term out."""
    setup_logging({"log_format": "json", "log_stream": "stdout", "group": "a", "node_id": "n2"},
                  "dledger-broker")
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert (first["group"], first["node"], first["term"]) == ("a", "n2", None)
    assert first["program"] == "dledger-broker"
    setup_logging({"log_format": "text", "log_stream": "stdout", "group": "a", "node_id": "n2"},
                  "dledger-broker")
    assert "[group=a node=n2] dledger-broker" in capsys.readouterr().out


def test_the_images_environment_chooses_json_on_stdout(monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy/Dockerfile sets DLEDGER_LOG_FORMAT and DLEDGER_LOG_STREAM: both servers read them
    when the options are not given (an option given wins)."""
    monkeypatch.setenv(logfmt.LOG_FORMAT_ENV, "json")
    monkeypatch.setenv(logfmt.LOG_STREAM_ENV, "stdout")
    params = namesrv_cli.commands["start"].make_context("start", []).params
    assert (params["log_format"], params["log_stream"]) == ("json", "stdout")
    broker = broker_start.make_context("start", ["--group", "a", "--id", "n0", "--peers",
                                                 "n0=127.0.0.1:1", "--data-dir", "/nonexistent",
                                                 "--log-format", "text"]).params
    assert (broker["log_format"], broker["log_stream"]) == ("text", "stdout")
    monkeypatch.setenv(logfmt.LOG_STREAM_ENV, "syslog")
    with pytest.raises(click.BadParameter, match="'syslog' is not one of 'stderr', 'stdout'") as bad:
        namesrv_cli.commands["start"].make_context("start", [])
    assert bad.value.param is not None and bad.value.param.name == "log_stream"
