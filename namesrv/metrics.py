"""The NameServer's Prometheus metrics, in the broker's own text exposition
(``broker.shell.exposition``): what its ``/metrics`` serves.

Owns the app's registry (one per app: NameServers sharing a test process keep theirs apart), the
middleware that counts and times every HTTP request by route and status (the route's pattern,
not the path, so a topic name never becomes a label), the counters the handlers bump
(registrations, stale leader claims refused, leases expired) and the gauges read from the
registry at scrape time (groups, nodes, topics, leaders known).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web
from aiohttp.typedefs import Middleware

from broker.shell.exposition import (
    CONTENT_TYPE_LATEST,
    Collector,
    CollectorRegistry,
    Counter,
    GaugeMetricFamily,
    Histogram,
    Metric,
    generate_latest,
)
from namesrv.registry import Registry

__all__ = ["NameServerMetrics", "metrics_middleware"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class NameServerMetrics:
    def __init__(self, registry: Registry, clock: Callable[[], float]) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("dledger_namesrv_http_requests", "HTTP requests answered, by "
                                "route and status code", ("route", "code"), registry=r)
        self.latency = Histogram("dledger_namesrv_http_request_duration_seconds",
                                 "HTTP request handling time, by route", ("route",),
                                 buckets=LATENCY_BUCKETS_S, registry=r)
        self.registrations = Counter("dledger_namesrv_registrations",
                                     "Broker registrations accepted", registry=r)
        self.stale_claims = Counter("dledger_namesrv_stale_claims", "Leader claims refused as "
                                    "stale (an older term than the group's)", registry=r)
        self.expired = Counter("dledger_namesrv_leases_expired", "Registrations dropped when "
                               "their lease ran out", registry=r)
        r.register(_RegistryCollector(registry, clock))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def handle(self, _: web.Request) -> web.Response:
        return web.Response(body=self.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})


def metrics_middleware(metrics: NameServerMetrics) -> Middleware:
    """Count and time each request by its route's pattern ("unmatched" for an unknown path)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started_s = time.perf_counter()
        route = request.match_info.route.resource
        name = route.canonical if route is not None else "unmatched"
        code = 500
        try:
            response = await handler(request)
            code = response.status
            return response
        except web.HTTPException as exc:
            code = exc.status
            raise
        finally:
            metrics.requests.labels(name, str(code)).inc()
            metrics.latency.labels(name).observe(time.perf_counter() - started_s)

    return middleware


class _RegistryCollector(Collector):
    def __init__(self, registry: Registry, clock: Callable[[], float]) -> None:
        self.registry = registry
        self.clock = clock

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        groups = self.registry.cluster(self.clock())
        out = []
        for name, doc, value in (
                ("dledger_namesrv_groups", "Broker groups with a live registration", len(groups)),
                ("dledger_namesrv_nodes", "Broker nodes with a live registration",
                 sum(len(g.nodes) for g in groups)),
                ("dledger_namesrv_groups_with_leader", "Groups whose leader is known",
                 sum(1 for g in groups if g.leader is not None)),
                ("dledger_namesrv_topics", "Topics routed", len(self.registry.topics()))):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            out.append(g)
        terms = GaugeMetricFamily("dledger_namesrv_group_term", "The term of a group's routed "
                                  "leader", labels=("group",))
        for view in groups:
            terms.add_metric([view.group], view.term)
        out.append(terms)
        return out
