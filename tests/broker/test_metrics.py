"""``/metrics`` of brokers and NameServers (``broker.shell.metrics``, ``namesrv.metrics``): the text parses
with ``prometheus_client.parser``; under the benchmark's load (its closed loop of sends, a batch
pipeline, parallel pulls) the counters and histograms move as the work done says; an election
shows on the new leader; the Grafana dashboard in ``deploy/`` reads only names that exist."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.harness import broker_group
from bench.load import closed_loop
from bench.nodeflags import NodeFlags
from client import Message, Producer, PullConsumer
from dledger.localcluster import LocalCluster
from tests.nodes.test_processes import wait_until

pytestmark = pytest.mark.slow

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dledger.json"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(session: aiohttp.ClientSession, url: str) -> tuple[Samples, set[str]]:
    """Every sample of a /metrics page by (name, sorted labels), and the family names."""
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    samples: Samples = {}
    families: set[str] = set()
    for family in text_string_to_metric_families(text):
        families.add(family.name)
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, families


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items()
               if n == name and set(labels.items()) <= set(ls))


def admin_url(cluster: LocalCluster, nid: str) -> str:
    host, port = cluster.servers[nid].ready["admin"]
    return f"http://{host}:{port}/metrics"


async def leader_of(session: aiohttp.ClientSession, cluster: LocalCluster) -> str:
    """The node whose /metrics says it leads (waited for)."""
    found: list[str] = []

    async def leads() -> bool:
        for nid, s in cluster.servers.items():
            if not s.running:
                continue
            try:
                samples, _ = await scrape(session, admin_url(cluster, nid))
            except (TimeoutError, aiohttp.ClientError):
                continue
            if value(samples, "dledger_is_leader") == 1:
                found.append(nid)
                return True
        return False
    await wait_until(leads, 20, "a node's /metrics saying it leads")
    return found[-1]


def test_metrics_move_under_the_benchmark_load_and_the_dashboard_reads_them() -> None:
    topic, body, k = "metrics-bench", b"m" * 256, 64
    n = 10 * k + k  # ten measured sends per caller and one warm-up each (closed_loop's)

    async def run(ns: str, cluster: LocalCluster) -> None:
        async with aiohttp.ClientSession() as session:
            async with Producer(ns, send_timeout_s=10) as p:
                await p.send(Message(topic, body))  # routed and created
                leader = await leader_of(session, cluster)
                before, _ = await scrape(session, admin_url(cluster, leader))
                # the benchmark's closed loop: 64 concurrent producers' sends, then a batch
                lat, _, failures = await closed_loop(lambda: p.send(Message(topic, body)), n - k, k,
                                                     warmup=k)
                assert len(lat) == n - k and failures == 0
                await p.send_batch([Message(topic, body) for _ in range(32)])
            async with PullConsumer(ns, "metrics-reader") as c:
                pulled = expected_lag = 0
                for mq in await c.fetch_queues(topic):
                    offset = 0
                    for _ in range(1000):  # bounded: the queue holds fewer than 1000 batches
                        r = await c.pull(mq, offset, 32)
                        if not r.messages:
                            break
                        pulled += len(r.messages)
                        offset = r.next_offset
                    await c.commit(mq, offset // 2)  # half read: the other half is its lag
                    expected_lag += offset - offset // 2
            assert pulled == n + 33
            # consumer lag is read from the replicated offsets: wait for the leader to apply
            scraped: list[tuple[Samples, set[str]]] = []

            async def lag_shown() -> bool:
                scraped.append(await scrape(session, admin_url(cluster, leader)))
                return value(scraped[-1][0], "dledger_consumer_lag_messages",
                             consumer_group="metrics-reader", topic=topic) == expected_lag
            await wait_until(lag_shown, 15, "the consumer lag to show the commits")
            after, families = scraped[-1]

            def moved(name: str, **labels: str) -> float:
                return value(after, name, **labels) - value(before, name, **labels)

            assert moved("dledger_messages_in_total", topic=topic) == n + 32
            assert moved("dledger_bytes_in_total", topic=topic) >= (n + 32) * len(body)
            # (the client may carry concurrent sends in one request: at most n + 1 requests)
            assert 1 <= moved("dledger_send_latency_seconds_count") <= n + 1
            assert moved("dledger_send_latency_seconds_sum") > 0
            count = moved("dledger_commit_latency_seconds_count")
            assert 1 <= count <= n + 1  # sends grouped into fewer entries
            assert moved("dledger_commit_latency_seconds_bucket", le="+Inf") == count
            assert moved("dledger_fsync_latency_seconds_count") >= 1
            assert moved("dledger_messages_out_total", topic=topic) == pulled
            assert moved("dledger_bytes_out_total", topic=topic) == pulled * len(body)
            assert moved("dledger_pull_requests_total", result="FOUND") >= 1
            assert value(after, "dledger_consumer_lag_messages", consumer_group="metrics-reader",
                         topic=topic) == expected_lag
            assert value(after, "dledger_queue_max_offset", topic=topic) == n + 33
            assert value(after, "dledger_is_leader") == 1
            assert value(after, "dledger_follower_match_index") > 0
            # an election: the next leader started one, and every survivor saw the change
            cluster.kill(leader)
            new_leader = await leader_of(session, cluster)
            elected, families2 = await scrape(session, admin_url(cluster, new_leader))
            assert value(elected, "dledger_elections_total") >= 1
            assert value(elected, "dledger_leader_changes_total") >= 2  # the first, then itself
            families |= families2
            # the NameServer's own
            ns_samples, ns_families = await scrape(session, f"http://{ns}/metrics")
            assert value(ns_samples, "dledger_namesrv_registrations_total") >= 3
            assert value(ns_samples, "dledger_namesrv_http_requests_total",
                         route="/v1/topics/{topic}/route", code="200") >= 1
            assert value(ns_samples, "dledger_namesrv_nodes") >= 2
            families |= ns_families
        check_dashboard(families)

    with broker_group("sync", NodeFlags()) as (ns, cluster):
        asyncio.run(run(ns, cluster))


def check_dashboard(families: set[str]) -> None:
    """Every metric a panel of the Grafana dashboard queries is one the servers export."""
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel.get("targets", [])]
    assert len(exprs) >= 8
    names = {name for expr in exprs for name in re.findall(r"\b(dledger_[a-z_]+)\b", expr)}
    assert names
    exported = set()
    for family in families:  # a histogram's series, a counter's _total
        exported |= {family, f"{family}_total", f"{family}_bucket", f"{family}_sum",
                     f"{family}_count"}
    assert names <= exported, f"the dashboard reads names no server exports: {names - exported}"
