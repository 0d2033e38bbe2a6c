"""``/metrics`` written by our own exposition (``broker.shell.exposition``) is the text
``prometheus_client`` wrote, series by series: the same families built with both print the same
lines (only the ``_created`` times differ: each is its own object's), and a running broker node
serves what ``broker/shell/metrics.py`` printed over ``prometheus_client`` (the module before
issue 37: the same source, its exposition names bound to ``prometheus_client``'s), fed the
same traffic and the same clock readings."""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import re
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import prometheus_client
import prometheus_client.core
import prometheus_client.registry
import pytest
from prometheus_client.parser import text_string_to_metric_families

import broker.shell.exposition as ours
import broker.shell.metrics as metrics_module
from broker.api.handlers import offset_commit
from broker.config import BrokerConfig
from broker.server import BrokerServer
from broker.shell.http_client import HttpClient
from broker.shell.metrics import FSYNC_BUCKETS_S, LATENCY_BUCKETS_S
from dledger.node.runtime import NodeConfig
from tests.log.test_retention import _raw
from tests.nodes.test_processes import wait_until

NAMES = ("CONTENT_TYPE_LATEST", "Collector", "CollectorRegistry", "Counter", "CounterMetricFamily",
         "GaugeMetricFamily", "Histogram", "Metric", "generate_latest")


def prometheus_kit() -> ModuleType:
    """``prometheus_client``'s objects under the names ``broker.shell.exposition`` exports."""
    kit = ModuleType("prometheus_kit")
    for source in (prometheus_client, prometheus_client.core, prometheus_client.registry):
        for name in NAMES:
            if hasattr(source, name):
                setattr(kit, name, getattr(source, name))
    assert all(hasattr(kit, name) for name in NAMES)
    return kit


def masked(text: str) -> str:
    """``text`` with every ``_created`` sample's value (a creation time) replaced by T."""
    return re.sub(r"^(\w+_created(?:\{[^}]*\})?) \S+$", r"\1 T", text, flags=re.M)


def series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if not s.name.endswith("_created")}


def families_built_with(kit: Any) -> str:
    """Every kind of series ``broker.shell.metrics`` makes, with awkward values, printed."""
    r = kit.CollectorRegistry()
    sends = kit.Counter("x_messages_in", 'Help with \\ a backslash,\na newline and "quotes"',
                        ("group", "node", "topic"), registry=r)
    sends.labels("a", "n0", 't"q\\z\nw').inc(3)
    sends.labels("a", "n0", "plain").inc(2.5)
    sends.labels("a", "n0", "plain").inc()
    kit.Counter("x_unused", "A counter no path moved yet", ("group",), registry=r)
    kit.Counter("x_accepted", "A counter without labels (the NameServer's)", registry=r).inc(2)
    kit.Counter("x_refused", "One without labels never moved: 0 from the start", registry=r)
    latency = kit.Histogram("x_latency_seconds", "Latency", ("group", "node"),
                            buckets=LATENCY_BUCKETS_S, registry=r).labels("a", "n0")
    fsync = kit.Histogram("x_fsync_seconds", "Fsync", ("group", "node"),
                          buckets=FSYNC_BUCKETS_S, registry=r).labels("a", "n0")
    for value in (0.0002, 0.00021, 0.003, 2.5, 11.0, 0.0):
        latency.observe(value)
    for value in (0.00004, 0.00005, 0.5, 1e-9):
        fsync.observe(value)

    class Read(kit.Collector):  # type: ignore[misc, name-defined]
        def describe(self) -> list[Any]:
            return []

        def collect(self) -> list[Any]:
            g = kit.GaugeMetricFamily("x_term", "Term", labels=("group", "node"))
            g.add_metric(["a", "n0"], 7)
            g.add_metric(["a", "n1"], 12345678)
            c = kit.CounterMetricFamily("x_elections", "Elections", labels=("group", "node"))
            c.add_metric(["a", "n0"], 1234567.0)
            c.add_metric(["a", "n1"], 0.1 + 0.2)
            lag = kit.GaugeMetricFamily("x_lag", "Lag", labels=("group", "node", "follower"))
            return [g, c, lag]
    r.register(Read())
    return str(kit.generate_latest(r).decode())


def test_our_text_is_prometheus_clients_line_for_line() -> None:
    mine, theirs = families_built_with(ours), families_built_with(prometheus_kit())
    assert masked(mine) == masked(theirs)
    assert series(mine) == series(theirs) and len(series(mine)) == 42
    created = [line for line in mine.splitlines() if line.startswith("x_messages_in_created")]
    assert len(created) == 2 and all(abs(float(c.split()[-1]) - time.time()) < 600 for c in created)
    assert ours.CONTENT_TYPE_LATEST.startswith("text/plain; version=0.0.4")


def test_bad_uses_are_refused() -> None:
    r = ours.CollectorRegistry()
    counter = ours.Counter("c", "doc", ("a", "b"), registry=r)
    with pytest.raises(ValueError, match="label values"):
        counter.labels("only one")
    with pytest.raises(ValueError, match="only goes up"):
        counter.labels("x", "y").inc(-1)
    with pytest.raises(ValueError, match="ascending"):
        ours.Histogram("h", "doc", ("a",), buckets=(1.0, 0.5), registry=r)
    with pytest.raises(ValueError, match="le"):
        ours.Histogram("h", "doc", ("le",), buckets=(1.0,), registry=r)


def over_prometheus_client(path: str, name: str) -> ModuleType:
    """The module at ``path`` loaded again as ``name``, with ``broker.shell.exposition``'s names
    bound to ``prometheus_client``'s."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = sys.modules["broker.shell.exposition"]
    sys.modules["broker.shell.exposition"] = prometheus_kit()
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules["broker.shell.exposition"] = saved
    return module


def old_metrics_module() -> ModuleType:
    """``broker/shell/metrics.py`` over ``prometheus_client``: how the broker's metrics were
    written before issue 37 (the module's only change then was where these names came from)."""
    return over_prometheus_client(metrics_module.__file__, "old_broker_metrics")


class PairedClock:
    """The old module's ``perf_counter`` reads what the new one's read (the tee calls the new
    first), so both observe the same latencies."""

    def __init__(self) -> None:
        self.readings: collections.deque[float] = collections.deque()

    def lead(self) -> float:
        self.readings.append(time.perf_counter())
        return self.readings[-1]

    def follow(self) -> float:
        return self.readings.popleft()


class Tee:
    """What the broker's paths count, counted by both."""

    def __init__(self, new: Any, old: Any) -> None:
        self.both = (new, old)

    def sent(self, *args: Any) -> None:
        for m in self.both:
            m.sent(*args)

    def proposed(self, fut: asyncio.Future[Any]) -> None:
        for m in self.both:
            m.proposed(fut)

    def refused(self, err: Exception) -> None:
        for m in self.both:
            m.refused(err)

    def passed_expired(self, path: str, count: int) -> None:
        for m in self.both:
            m.passed_expired(path, count)

    def pulled(self, topic: str, result: str, messages: list[Any]) -> None:
        for m in self.both:
            m.pulled(topic, result, messages)

    def fsynced(self, seconds: float) -> None:
        for m in self.both:
            m.fsync_latency.observe(seconds)


class Denied(Exception):
    code = "ACCESS_DENIED"


def test_a_running_node_serves_what_prometheus_client_wrote(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old_module = old_metrics_module()
    clock = PairedClock()
    monkeypatch.setattr(metrics_module, "time", SimpleNamespace(perf_counter=clock.lead))
    monkeypatch.setattr(old_module, "time", SimpleNamespace(perf_counter=clock.follow))
    node = NodeConfig(group="g", node_id="n0", peers={"n0": ("127.0.0.1", 0)},
                      data_dir=str(tmp_path), tick_interval_s=0.02)
    server = BrokerServer(BrokerConfig(node, admin_listen=("127.0.0.1", 0)))

    async def run() -> tuple[str, str, str]:
        await server.start()
        try:
            broker = server.broker
            old = old_module.BrokerMetrics(server)
            tee = Tee(server.metrics, old)
            broker.metrics = server.native.refusals = tee  # type: ignore[assignment]
            broker.node.stats.fsync_observer = tee.fsynced
            await wait_until(lambda: broker.node.is_leader, 10, "the node to lead")
            for i in range(20):
                await broker.sends.send("orders", i % 2, _raw(b"m%03d" % i))
            await broker.sends.send("audit", 0, _raw(b"x" * 300))
            await broker.pull("orders", 0, 0, 32, 1 << 20, 0, ["*"])
            await broker.pull("orders", 1, 50, 32, 1 << 20, 0, ["*"])  # past the end
            await offset_commit(broker, "readers", "orders", 0, 4)
            await wait_until(lambda: broker.state.offsets, 10, "the offset to apply")
            broker.count_expired("pop", 2)
            tee.refused(Denied())
            tee.refused(ValueError("malformed"))
            new_text, old_text = server.metrics.render(), old.render()  # (no turn between)
            assert server.admin_address is not None
            http = HttpClient()
            scraped = await http.request("GET", "http://{}:{}/metrics".format(
                *server.admin_address), timeout_s=10)
            await http.close()
            assert scraped.status == 200
            assert scraped.headers["Content-Type"].startswith("text/plain")
            return new_text.decode(), old_text.decode(), scraped.text()
        finally:
            await server.stop()

    new, old, scraped = asyncio.run(run())
    assert masked(new) == masked(old)
    assert series(new) == series(old)
    assert series(scraped).keys() == series(old).keys()
    # what was counted shows (both sides being equal would hold for nothing counted too)
    got = series(new)
    base = (("group", "g"), ("node", "n0"))
    assert got[("dledger_messages_in_total", (*base, ("topic", "orders")))] == 20
    assert got[("dledger_send_latency_seconds_count", base)] == 21
    assert got[("dledger_pull_requests_total", (*base, ("result", "FOUND")))] == 1
    assert got[("dledger_messages_expired_total", (("group", "g"), ("node", "n0"),
                                                   ("path", "pop")))] == 2
    assert got[("dledger_acl_refusals_total", (*base, ("reason", "denied")))] == 1
    assert got[("dledger_consumer_lag_messages", (("consumer_group", "readers"), *base,
                                                  ("queue", "0"), ("topic", "orders")))] == 6
    assert got[("dledger_fsync_latency_seconds_count", base)] >= 1
