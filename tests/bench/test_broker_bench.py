"""The broker benchmark's bookkeeping (the tool itself is run by hand: it needs nats-server and
minutes of both cores): ratios to NATS, CPU per 10,000 messages and peak memory per row."""

from __future__ import annotations

import os

from bench.broker import render, topics_workload
from bench.harness import Row, Servers


def test_rows_carry_ratios_cpu_and_memory_of_the_server_processes() -> None:
    servers = Servers([os.getpid()])  # this process stands in for a server
    cpu0 = servers.cpu_s()
    sum(i * i for i in range(300_000))  # some CPU to measure
    ours = servers.measured(Row("dledger", "async", "batch", 1024, 60_000.0), cpu0, 20_000)
    assert ours.cpu_s_per_10k is not None and ours.cpu_s_per_10k >= 0
    assert ours.peak_rss_mib is not None and ours.peak_rss_mib > 1
    assert Servers([2**22 + 7]).peak_rss_mib() is None  # a process that is gone: no figure
    nats = Row("NATS JetStream R3", "-", "batch", 1024, 30_000.0)
    table = render([nats, ours]).splitlines()
    assert "cpu s/10k" in table[0] and "peak MiB" in table[0]
    assert " 2.00 " in table[3]  # 60,000 / 30,000 msg/s
    assert f"{ours.peak_rss_mib:.2f}" in table[3] and "-" in table[2].split()[-1]


def test_the_many_topics_row_is_compared_with_nats_over_as_many_subjects() -> None:
    nats = Row("NATS JetStream R3", "-", topics_workload(64), 1024, 8_000.0)
    one_topic = Row("NATS JetStream R3", "-", "concurrent", 1024, 2_000.0)
    ours = Row("dledger", "async", topics_workload(64), 1024, 4_000.0)
    line = render([nats, one_topic, ours]).splitlines()[-1]
    assert line.startswith("64 topics") and " 0.50 " in line  # against NATS's 64 subjects
