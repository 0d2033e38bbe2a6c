"""The web console in a real browser: Debian's chromium (``/usr/bin/chromium``) driven by
Playwright (its own browser download is never used). A NameServer and a 3-node broker group run
as processes; the page shows the group with three nodes and one leader, the leader process is
killed by its PID and the page shows a new leader (and the old one unreachable) without a
reload, a topic is created through the form and its confirmation dialog and shows in the topics
table, and a screenshot is kept (in the test's tmp dir; also at ``$DLEDGER_CONSOLE_SCREENSHOT``
when set, which is how ``docs/console.png`` is made).

Without chromium or playwright the test is skipped, saying which is missing, unless ``CI`` is
set: there a missing browser fails (``.ci/run`` installs it)."""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.clusters import namesrv_group

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
SCREENSHOT_ENV = "DLEDGER_CONSOLE_SCREENSHOT"
NEW_LEADER_TIMEOUT_MS = 30_000  # an election after a kill, plus a poll: seconds, not tens
TOPIC = "browser-orders"


def _playwright() -> Any:
    """playwright.sync_api, or a skip (a failure in CI) naming what is missing."""
    missing = []
    if not os.access(CHROMIUM, os.X_OK):
        missing.append(f"{CHROMIUM} (apt-get install chromium)")
    sync_api: Any = None
    try:
        sync_api = importlib.import_module("playwright.sync_api")
    except ImportError:
        missing.append("playwright (pip install -e '.[dev]')")
    if missing:
        why = f"the browser test needs {' and '.join(missing)}"
        if os.environ.get("CI"):
            pytest.fail(why + "; CI must install it (.ci/run)")
        pytest.skip(why)
    return sync_api


def test_the_console_shows_a_leader_change_live_and_creates_a_topic(tmp_path: Path) -> None:
    pw = _playwright()
    expect = pw.expect
    with namesrv_group(tmp_path / "cluster") as (ns, cluster), pw.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 760})
            page.goto(f"http://{ns}/console")
            expect(page.locator("#live-state")).to_have_text("live", timeout=15_000)
            group = page.locator('.group[data-group="a"]')
            expect(group.locator("tbody tr")).to_have_count(3, timeout=15_000)
            leader_row = group.locator('tbody tr[data-role="leader"]')
            expect(leader_row).to_have_count(1, timeout=15_000)
            expect(group.locator('tbody tr[data-role="follower"]')).to_have_count(
                2, timeout=15_000)  # (a follower may register, or answer a poll, a moment later)
            old = leader_row.get_attribute("data-node")
            assert old in cluster.servers
            expect(group.locator(".leader")).to_have_text(old)

            cluster.kill(old)  # SIGKILL to that node's PID (LocalCluster.kill)
            new_leader = group.locator(f'tbody tr[data-role="leader"]:not([data-node="{old}"])')
            expect(new_leader).to_have_count(1, timeout=NEW_LEADER_TIMEOUT_MS)
            expect(group.locator(f'tbody tr[data-node="{old}"]')).to_have_attribute(
                "data-role", "unreachable", timeout=NEW_LEADER_TIMEOUT_MS)
            expect(group.locator(f'tbody tr[data-node="{old}"] td.node-state')).to_contain_text(
                "unreachable: cannot connect")
            # its last contact (the 8th column): since when, from what a member heard, not "never"
            expect(group.locator(f'tbody tr[data-node="{old}"] td:nth-child(8)')).to_contain_text(
                "unreachable since", timeout=NEW_LEADER_TIMEOUT_MS)
            expect(group.locator(".leader")).not_to_have_text(old)

            page.click('nav a[data-tab="topics"]')
            form = page.locator("#topic-form")
            form.locator('[name="topic_name"]').fill(TOPIC)
            form.locator('[name="queues"]').fill("2")
            form.locator('button[type="submit"]').click()
            dialog = page.locator("#confirm")
            expect(dialog).to_be_visible()
            expect(page.locator("#confirm-text")).to_contain_text(f"Create topic {TOPIC}")
            page.click("#confirm-ok")
            expect(page.locator("#topic-result")).to_have_text(
                f"topic {TOPIC}: created on a", timeout=30_000)
            row = page.locator(f'#topics-table tr[data-topic="{TOPIC}"]')
            expect(row).to_have_count(1, timeout=30_000)  # the table refreshes every 3 s
            expect(row).to_contain_text("a/0: 0 … 0", timeout=30_000)

            page.click('nav a[data-tab="cluster"]')
            expect(new_leader).to_have_count(1, timeout=15_000)
            shot = tmp_path / "console.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            if os.environ.get(SCREENSHOT_ENV):
                shutil.copyfile(shot, os.environ[SCREENSHOT_ENV])
        finally:
            browser.close()
