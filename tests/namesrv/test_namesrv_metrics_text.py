"""The NameServer's ``/metrics`` written by our own exposition (``broker.shell.exposition``) is
the text ``prometheus_client`` wrote: ``namesrv/metrics.py`` loaded a second time with those
names bound to ``prometheus_client``'s (how it was written before), both fed the same
registrations and requests, print the same lines (only the ``_created`` times differ)."""

from __future__ import annotations

import namesrv.metrics as metrics_module
from namesrv.registry import Registry
from tests.broker.test_metrics_text import masked, over_prometheus_client, series
from tests.namesrv.test_namesrv_registry import reg


def test_the_namesrv_text_is_what_prometheus_client_wrote() -> None:
    registry = Registry()
    registry.register(reg("n0", "leader", term=3), now_s=0.0)
    registry.register(reg("n1", port=10912), now_s=0.0)
    registry.register(reg("m0", "leader", term=5, group="b", port=10913), now_s=0.0)
    ours = metrics_module.NameServerMetrics(registry, lambda: 1.0)
    theirs = over_prometheus_client(
        metrics_module.__file__, "old_namesrv_metrics").NameServerMetrics(registry, lambda: 1.0)
    for m in (ours, theirs):
        m.registrations.inc()
        m.registrations.inc(2)
        m.requests.labels("/register", "200").inc()
        m.requests.labels("unmatched", "404").inc()
        for seconds in (0.0001, 0.003, 0.003, 4.0):
            m.latency.labels("/register").observe(seconds)
        # (stale_claims and expired never move: they print 0 from the start)
    mine, old = ours.render().decode(), theirs.render().decode()
    assert masked(mine) == masked(old)
    found = series(mine)
    assert found == series(old)
    assert found[("dledger_namesrv_registrations_total", ())] == 3
    assert found[("dledger_namesrv_stale_claims_total", ())] == 0
    assert found[("dledger_namesrv_nodes", ())] == 3
    assert found[("dledger_namesrv_group_term", (("group", "b"),))] == 5
