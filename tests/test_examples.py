"""The examples (``examples/``, the seed's Java examples in Python) run as a user runs them: each
a subprocess with ``--namesrv``, against one NameServer and one 3-node broker group (group
``a``, as ``dledger up`` starts them, with delay levels of 100-300 ms and a transaction timeout
of 1 s so that the delay, retry and transaction examples finish quickly), producers paired with
their consumers; their output is checked: each order's steps in order and one queue per order,
delays honoured, the splitter's batches and batches of at most 10 consumed, only the tags or ages
selected, growing reconsume times and then success, the transaction's TAGA and TAGC (by
check-back) consumed and TAGB never."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from click.testing import CliRunner

import cli
from tests.clusters import namesrv_group

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
LEVELS = "100ms 150ms 200ms 250ms 300ms " + " ".join(["300ms"] * 13)  # level 3: 200 ms
RUN_TIMEOUT_S = 60.0  # one example's run, at most (its own --timeout-s is shorter)
CONSUMER_TIMEOUT = ("--timeout-s", "40")


@pytest.fixture(scope="module")
def ns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with namesrv_group(tmp_path_factory.mktemp("examples"), "--delay-levels", LEVELS,
                       "--transaction-timeout-s", "1") as (ns, _):
        yield ns


class Example:
    """One example as a subprocess; its stdout and stderr read on threads (its stdout waited on
    with deadlines)."""

    def __init__(self, ns: str, name: str, *args: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, str(EXAMPLES / f"{name}.py"), "--namesrv", ns, *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        self.lines: list[str] = []
        self.err: list[str] = []
        self.cond = threading.Condition()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.readers = [threading.Thread(target=self._read, args=(stream, into), daemon=True)
                        for stream, into in ((self.proc.stdout, self.lines),
                                             (self.proc.stderr, self.err))]
        for t in self.readers:
            t.start()

    def _read(self, stream: IO[str], into: list[str]) -> None:
        for text in stream:
            with self.cond:
                into.append(text.rstrip("\n"))
                self.cond.notify_all()

    def wait_line(self, text: str, timeout_s: float = RUN_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while text not in self.lines:
                left = deadline - time.monotonic()
                assert left > 0 and self.proc.poll() is None, \
                    f"{self.name}: no line {text!r}: {self.lines}"
                self.cond.wait(min(left, 0.5))

    def finish(self) -> tuple[int, list[str], str]:
        """Wait for its exit (killed by its PID past the deadline): code, stdout lines, stderr."""
        try:
            self.proc.wait(timeout=RUN_TIMEOUT_S)
        finally:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=RUN_TIMEOUT_S)
            for t in self.readers:
                t.join(timeout=RUN_TIMEOUT_S)
        with self.cond:
            return self.proc.returncode, list(self.lines), "\n".join(self.err)


def run_ok(ns: str, name: str, *args: str) -> list[str]:
    code, out, err = Example(ns, name, *args).finish()
    assert code == 0, f"{name} exited {code}:\n" + "\n".join(out) + f"\n--- stderr:\n{err}"
    return out


def finish_ok(example: Example) -> list[str]:
    code, out, err = example.finish()
    assert code == 0, f"{example.name} exited {code}:\n" + "\n".join(out) + f"\n--- stderr:\n{err}"
    return out


def field(text: str, name: str) -> str:
    m = re.search(rf"\b{name}=(\S+)", text)
    assert m, f"no {name}= in {text!r}"
    return m.group(1)


def bodies(lines: list[str]) -> list[str]:
    return [m.group(1) for ln in lines if (m := re.search(r"body='([^']*)'", ln))]


def create_topic(ns: str, topic: str) -> None:
    res = CliRunner().invoke(cli.main, ["topic", "create", "--namesrv", ns, "--queues", "4", topic])
    assert res.exit_code == 0, res.output


def test_ordered_each_orders_steps_in_one_queue_and_consumed_in_order(ns: str) -> None:
    sent = run_ok(ns, "ordered_producer", "--topic", "TopicA", "--count", "6")
    queues: dict[str, set[str]] = defaultdict(set)
    for ln in sent:
        order = re.match(r"order (\d+) step \d", ln)
        assert order and "SEND_OK" in ln, ln
        queues[order.group(1)].add(field(ln, "queue"))
    assert len(sent) == 24 and sorted(queues, key=int) == [str(i) for i in range(6)]
    for order, qs in queues.items():  # the seed's selector: order id modulo the queue count
        assert qs == {f"a/{int(order) % 4}"}, (order, qs)
    got = finish_ok(Example(ns, "ordered_consumer", "--topic", "TopicA", "--count", "6",
                            "--group", "cg-ordered", *CONSUMER_TIMEOUT))
    steps: dict[str, list[int]] = defaultdict(list)
    for ln in got:
        if m := re.match(r"order (\d+) step (\d):", ln):
            steps[m.group(1)].append(int(m.group(2)))
    assert steps == {str(i): [0, 1, 2, 3] for i in range(6)}, got


def delayed(lines: list[str]) -> list[int]:
    return [int(field(ln, "delayed_ms")) for ln in lines if "delayed_ms=" in ln]


def test_delayed_messages_are_consumed_no_earlier_than_their_level(ns: str) -> None:
    create_topic(ns, "TopicB")  # the consumer starts first, as a user would run the pair
    consumer = Example(ns, "other_consumer", "--topic", "TopicB", "--group", "cg-delay",
                       "--count", "5", "--min-delay-ms", "200", *CONSUMER_TIMEOUT)
    try:
        consumer.wait_line("Consumer Started")
        sent = run_ok(ns, "delay_producer", "--topic", "TopicB", "--count", "5",
                      "--delay-level", "3")
    finally:
        got = finish_ok(consumer)
    assert len([ln for ln in sent if "SEND_OK" in ln]) == 5, sent
    assert sorted(bodies(got)) == [f"Hi,{i}" for i in range(5)], got
    assert all(ms >= 200 for ms in delayed(got)) and len(delayed(got)) == 5, got


def test_a_delay_in_ms_holds_messages_as_long(ns: str) -> None:
    run_ok(ns, "delay_producer", "--topic", "TopicB2", "--count", "3", "--delay-ms", "700")
    got = run_ok(ns, "other_consumer", "--topic", "TopicB2", "--group", "cg-delay2",
                 "--count", "3", "--min-delay-ms", "700", *CONSUMER_TIMEOUT)
    assert sorted(bodies(got)) == ["Hi,0", "Hi,1", "Hi,2"] and min(delayed(got)) >= 700, got


def test_the_splitter_cuts_batches_and_the_consumer_gets_batches_of_ten(ns: str) -> None:
    sent = run_ok(ns, "batch_producer", "--topic", "someTopic", "--count", "100",
                  "--pad-bytes", "50000")
    sizes = [int(m.group(1)) for ln in sent if (m := re.match(r"batch of (\d+) message", ln))]
    assert len(sizes) == 2 and sum(sizes) == 100, sent  # 5 MB: more than one 4 MiB batch
    got = run_ok(ns, "batch_consumer", "--topic", "someTopic", "--group", "cg-batch",
                 "--count", "100", *CONSUMER_TIMEOUT)
    batches = [int(m.group(1)) for ln in got if (m := re.match(r"batch of (\d+) message", ln))]
    assert sum(batches) == 100 and max(batches) == 10, batches
    assert sorted(b.split(".")[0] for b in bodies(got)) == sorted(f"Hi,{i}" for i in range(100))


def test_the_tag_consumer_gets_only_the_tags_it_names(ns: str) -> None:
    run_ok(ns, "filter_by_tag_producer", "--topic", "myTopic", "--count", "10")
    got = run_ok(ns, "filter_by_tag_consumer", "--topic", "myTopic", "--group", "cg-tag",
                 *CONSUMER_TIMEOUT)
    assert sorted(bodies(got)) == sorted(f"Hi,{i}" for i in (0, 1, 3, 4, 6, 7, 9)), got
    assert {field(ln, "tags") for ln in got if "body=" in ln} == {"'myTagA'", "'myTagB'"}


def test_the_sql_consumer_gets_only_the_ages_selected(ns: str) -> None:
    run_ok(ns, "filter_by_sql_producer", "--topic", "myTopic", "--count", "10")
    got = run_ok(ns, "filter_by_sql_consumer", "--topic", "myTopic", "--group", "cg-sql",
                 *CONSUMER_TIMEOUT)
    assert sorted(bodies(got)) == sorted(f"Hi,{i}" for i in range(7)), got
    got = run_ok(ns, "filter_by_sql_consumer", "--topic", "myTopic", "--group", "cg-sql-8",
                 "--low", "8", "--high", "20", "--count", "2", *CONSUMER_TIMEOUT)
    assert sorted(bodies(got)) == ["Hi,8", "Hi,9"], got


def test_the_retry_consumer_sees_growing_reconsume_times_then_success(ns: str) -> None:
    code, out, err = Example(ns, "retry_consumer", "--topic", "TopicC", "--group", "cg-retry",
                             "--count", "2", "--fail-times", "3", "--timeout-s", "50").finish()
    assert code == 0, "\n".join(out) + f"\n--- stderr:\n{err}"
    seen: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for ln in out:
        if m := re.search(r"body='([^']*)' -> (\S+)$", ln):
            seen[m.group(1)].append((int(field(ln, "reconsume_times")), m.group(2)))
    want = [(0, "RECONSUME_LATER"), (1, "null"), (2, "exception"), (3, "CONSUME_SUCCESS")]
    assert seen == {"Hi,0": want, "Hi,1": want}, out
    assert "failed on purpose" in err  # the library logs a listener's exception


def test_the_transaction_producer_commits_taga_rolls_back_tagb_and_checks_back_tagc(
        ns: str) -> None:
    out = run_ok(ns, "transaction_producer", "--topic", "TTopic", "--timeout-s", "40")
    states = [ln.split()[0] for ln in out if "SEND_OK" in ln]
    assert states == ["COMMIT", "ROLLBACK", "UNKNOWN"], out
    assert "check-back: tags=TAGC -> COMMIT" in out, out
    got = finish_ok(Example(ns, "other_consumer", "--topic", "TTopic", "--group", "cg-txn",
                            "--count", "2", *CONSUMER_TIMEOUT))
    assert sorted(bodies(got)) == ["Hi,0", "Hi,2"], got


def test_the_pipeline_writes_one_output_per_input(ns: str) -> None:
    create_topic(ns, "PipeIn")
    sent = CliRunner().invoke(cli.main, ["send", "--namesrv", ns, "PipeIn", "a", "b", "c"])
    assert sent.exit_code == 0, sent.output
    out = run_ok(ns, "exactly_once_pipeline", "--count", "3", "--timeout-s", "40")
    assert out[-1].startswith("committed 3 inputs") and out[-1].endswith("lag 0"), out
    got = CliRunner().invoke(cli.main, ["consume", "--namesrv", ns, "PipeOut"])
    assert got.exit_code == 0, got.output
    assert sorted(ln.rsplit(" ", 1)[-1] for ln in got.output.splitlines() if "msg_id=" in ln) \
        == ["b'A'", "b'B'", "b'C'"], got.output
