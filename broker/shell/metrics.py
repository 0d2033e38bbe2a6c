"""A broker node's Prometheus metrics: what ``/metrics`` serves, written with our own exposition
(``broker.shell.exposition``, the text ``prometheus-client`` printed; the broker process loads
no metrics library).

Owns the node's registry (one per ``BrokerServer``, so nodes sharing a process in the tests keep
theirs apart) and two kinds of series, all labelled with the node's ``group`` and ``node``:

- counted as things happen, on the paths that do them: messages and bytes stored by the sends
  this node led (``dledger_messages_in_total``, ``dledger_bytes_in_total``, by topic), messages
  and bytes handed out by pulls and pull requests by result, and three histograms: a send's
  latency (request in to answer out, on the leader), a send entry's commit latency (proposed to
  applied) and each fsync's;
- read at scrape time from the node's status (``_StatusCollector``): role, term, indexes,
  follower match and lag, connections, and the counters the node and its services keep
  (elections, leader changes, snapshots, checkpoints, retention), per-queue max offsets and
  consumer lag by group and queue (at most ``QUEUE_SERIES_MAX`` queues of each kind: the rest
  are counted in ``dledger_metric_series_omitted``).

Names follow Prometheus' conventions: base units in the name (``_seconds``, ``_bytes``),
``_total`` on counters only. Nothing here decides anything: a view for operators.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from broker.config import BrokerConfig
from broker.machine.state import BrokerState
from broker.shell.exposition import (
    CONTENT_TYPE_LATEST,
    Collector,
    CollectorRegistry,
    Counter,
    CounterMetricFamily,
    GaugeMetricFamily,
    Histogram,
    Metric,
    generate_latest,
)
from dledger.node.config import Committed
from dledger.node.runtime import Node
from protocol.framed import ConnectionLimits


class Checkpointed(Protocol):
    written: int
    failed: int


class MetricsHost(Protocol):
    """What the metrics read of a broker node (``broker.server.BrokerServer``)."""

    @property
    def group(self) -> str: ...

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def state(self) -> BrokerState: ...

    @property
    def node(self) -> Node: ...

    @property
    def limits(self) -> ConnectionLimits: ...

    @property
    def checkpoints(self) -> Checkpointed: ...

__all__ = ["CONTENT_TYPE_LATEST", "QUEUE_SERIES_MAX", "BrokerMetrics"]

LATENCY_BUCKETS_S = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                     1.0, 2.5, 5.0, 10.0)
FSYNC_BUCKETS_S = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                   0.1, 0.25, 1.0)
QUEUE_SERIES_MAX = 2000  # per-queue series of each kind (offsets, consumer lag) in one scrape
_BASE = ("group", "node")


class BrokerMetrics:
    """The registry of one broker node, and the calls its paths make to count."""

    def __init__(self, server: MetricsHost) -> None:
        self.server = server
        self.base = (server.group, server.config.node.node_id)
        r = self.registry = CollectorRegistry()
        by_topic = (*_BASE, "topic")
        self.messages_in = Counter("dledger_messages_in", "Messages stored by sends this node "
                                   "answered as leader, by topic", by_topic, registry=r)
        self.bytes_in = Counter("dledger_bytes_in", "Bytes of messages stored by sends this node "
                                "answered as leader (as sized for --max-message-bytes)", by_topic,
                                registry=r)
        self.messages_out = Counter("dledger_messages_out", "Messages handed out by pulls, by topic",
                                    by_topic, registry=r)
        self.bytes_out = Counter("dledger_bytes_out", "Bytes of message bodies handed out by pulls",
                                 by_topic, registry=r)
        self.pulls = Counter("dledger_pull_requests", "Pull requests answered, by result",
                             (*_BASE, "result"), registry=r)
        self.expired = Counter("dledger_messages_expired", "Messages passed over by reads "
                               "because their TTL had passed (TTL_MS), by path (pull, pop)",
                               (*_BASE, "path"), registry=r)
        self.acl_refusals = Counter("dledger_acl_refusals", "Requests refused by access control, "
                                    "by reason (signature, denied, malformed)",
                                    (*_BASE, "reason"), registry=r)
        self.send_latency = Histogram(
            "dledger_send_latency_seconds", "A send request's arrival to its answer, on the leader",
            _BASE, buckets=LATENCY_BUCKETS_S, registry=r).labels(*self.base)
        self.commit_latency = Histogram(
            "dledger_commit_latency_seconds", "A send entry proposed to committed and applied",
            _BASE, buckets=LATENCY_BUCKETS_S, registry=r).labels(*self.base)
        self.fsync_latency = Histogram(
            "dledger_fsync_latency_seconds", "Each group commit's fsync of the log",
            _BASE, buckets=FSYNC_BUCKETS_S, registry=r).labels(*self.base)
        r.register(_StatusCollector(server))
        self._in: dict[str, tuple[Any, Any]] = {}  # topic -> its (messages, bytes) children
        self._out: dict[str, tuple[Any, Any]] = {}
        self._pulls: dict[str, Any] = {}

    def attach(self) -> None:
        """Time the node's fsyncs (its flusher exists once it started)."""
        self.server.node.stats.fsync_observer = self.fsync_latency.observe

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- the paths' calls ------------------------------------------------------------------------

    def sent(self, runs: Sequence[tuple[str, int, int]], answers: Sequence[Any],
             started_s: float) -> None:
        """A send request answered: its stored runs counted, its latency observed."""
        self.send_latency.observe(time.perf_counter() - started_s)
        for (topic, count, size), answer in zip(runs, answers):
            if answer is not None and answer[0] == "SEND_OK":
                pair = self._in.get(topic)
                if pair is None:
                    pair = self._in[topic] = (self.messages_in.labels(*self.base, topic),
                                              self.bytes_in.labels(*self.base, topic))
                pair[0].inc(count)
                pair[1].inc(size)

    def proposed(self, fut: asyncio.Future[Committed]) -> None:
        """A send entry proposed: its commit latency is observed when it is applied."""
        started_s = time.perf_counter()
        observe = self.commit_latency.observe

        def done(f: asyncio.Future[Committed]) -> None:
            if not f.cancelled() and f.exception() is None:
                observe(time.perf_counter() - started_s)

        fut.add_done_callback(done)

    def refused(self, err: Exception) -> None:
        """A request access control refused (``broker.features.acl.service``)."""
        reason = {"SIGNATURE_REFUSED": "signature", "ACCESS_DENIED": "denied"}.get(
            getattr(err, "code", ""), "malformed")
        self.acl_refusals.labels(*self.base, reason).inc()

    def passed_expired(self, path: str, count: int) -> None:
        """``count`` expired messages a read passed over (``protocol.message_ttl``)."""
        self.expired.labels(*self.base, path).inc(count)

    def pulled(self, topic: str, result: str, messages: list[Any]) -> None:
        child = self._pulls.get(result)
        if child is None:
            child = self._pulls[result] = self.pulls.labels(*self.base, result)
        child.inc()
        if messages:
            pair = self._out.get(topic)
            if pair is None:
                pair = self._out[topic] = (self.messages_out.labels(*self.base, topic),
                                           self.bytes_out.labels(*self.base, topic))
            pair[0].inc(len(messages))
            pair[1].inc(sum(len(m[1]) for m in messages))


class _StatusCollector(Collector):
    """Series read from the node's status at each scrape."""

    def __init__(self, server: MetricsHost) -> None:
        self.server = server

    def describe(self) -> Iterable[Metric]:
        return []  # (read at scrape time: the node may not have started when registered)

    def collect(self) -> Iterable[Metric]:
        server = self.server
        node = server.node
        if node.core is None:
            return []
        st = node.status()
        raft = st.raft
        base = list((server.group, raft.node_id))
        out: list[Metric] = []

        def gauge(name: str, doc: str, value: float) -> None:
            g = GaugeMetricFamily(name, doc, labels=_BASE)
            g.add_metric(base, value)
            out.append(g)

        def counter(name: str, doc: str, value: float) -> None:
            c = CounterMetricFamily(name, doc, labels=_BASE)
            c.add_metric(base, value)
            out.append(c)

        gauge("dledger_is_leader", "1 if this node leads its group", int(raft.role.value == "leader"))
        gauge("dledger_disk_full", "1 while a write failed for want of space (it takes no part)",
              int(st.disk_full))
        gauge("dledger_term", "Current Raft term", raft.term)
        gauge("dledger_last_index", "Last log index", raft.last_index)
        gauge("dledger_commit_index", "Commit index", raft.commit_index)
        gauge("dledger_applied_index", "Index applied to the broker state", server.state.applied_index)
        gauge("dledger_storage_first_index", "First log index still on disk (retention)",
              st.storage_first_index)
        gauge("dledger_pending_proposals", "Proposals waiting for commit", st.pending_proposals)
        gauge("dledger_topics", "Topics known", len(server.state.topics))
        gauge("dledger_queue_messages", "Units in all consume queues",
              sum(len(u) for u in server.state.queues.values()))
        limits = server.limits
        gauge("dledger_client_connections", "Client connections open", len(limits.open))
        gauge("dledger_client_input_buffered_bytes", "Bytes of partial frames held by clients",
              limits.held_bytes)
        counter("dledger_client_connections_refused", "Client connections refused at the limit",
                limits.refused)
        counter("dledger_client_connections_evicted",
                "Client connections closed by the input budget", limits.evicted)
        counter("dledger_inbox_dropped", "Peer messages dropped by a full inbox", st.inbox_dropped)
        stats = node.stats
        counter("dledger_elections", "Elections this node started (candidacies)",
                stats.elections_started)
        counter("dledger_leader_changes", "Changes of the leader this node knows",
                stats.leader_changes)
        counter("dledger_retention_runs", "Retention runs that deleted log segments",
                stats.retention_runs)
        counter("dledger_retention_deleted_entries", "Log entries deleted by retention",
                stats.retention_entries_deleted)
        snap = node.snapshot_status()
        counter("dledger_snapshots_sent", "Snapshots sent to followers", _int(snap.get("sent")))
        counter("dledger_snapshot_send_failures", "Snapshot transfers that failed",
                _int(snap.get("send_failures")))
        counter("dledger_snapshots_installed", "Snapshots installed from the leader",
                _int(snap.get("installed")))
        counter("dledger_checkpoints", "Checkpoints of the broker state written",
                server.checkpoints.written)
        counter("dledger_checkpoint_failures", "Checkpoint writes that failed",
                server.checkpoints.failed)
        followers = GaugeMetricFamily("dledger_follower_match_index",
                                      "A follower's match index (on the leader)",
                                      labels=(*_BASE, "follower"))
        lag = GaugeMetricFamily("dledger_follower_lag_entries",
                                "Entries a follower is behind the leader's last index",
                                labels=(*_BASE, "follower"))
        for f in raft.followers:
            followers.add_metric([*base, f.node_id], f.match_index)
            lag.add_metric([*base, f.node_id], max(0, raft.last_index - f.match_index))
        out += [followers, lag]
        out += _queue_series(server, base)
        return out


def _queue_series(server: MetricsHost, base: list[str]) -> list[Metric]:
    """Per-queue max offsets and consumer lag by group and queue, bounded in count."""
    state = server.state
    omitted = 0
    offsets = GaugeMetricFamily("dledger_queue_max_offset",
                                "The next offset a queue assigns (its message count ever)",
                                labels=(*_BASE, "topic", "queue"))
    for k, ((topic, qid), units) in enumerate(state.queues.items()):
        if k >= QUEUE_SERIES_MAX:
            omitted += len(state.queues) - k
            break
        offsets.add_metric([*base, topic, str(qid)], len(units))
    lag = GaugeMetricFamily("dledger_consumer_lag_messages",
                            "Messages a consumer group's committed offset is behind the queue's end",
                            labels=(*_BASE, "consumer_group", "topic", "queue"))
    for k, ((group, topic, qid), offset) in enumerate(state.offsets.items()):
        if k >= QUEUE_SERIES_MAX:
            omitted += len(state.offsets) - k
            break
        _, hi = state.queue_range(topic, qid)
        lag.add_metric([*base, group, topic, str(qid)], max(0, hi - offset))
    dropped = GaugeMetricFamily("dledger_metric_series_omitted",
                                f"Per-queue series left out past {QUEUE_SERIES_MAX} of a kind",
                                labels=_BASE)
    dropped.add_metric(base, omitted)
    return [offsets, lag, dropped]


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0
