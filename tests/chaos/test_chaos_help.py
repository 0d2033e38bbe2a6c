"""``dledger chaos run --help`` works with the base install only: the chaos harness loads the
dev extra's packages (toxiproxy-python, requests, matplotlib) where it uses them, not when the
command is imported (issue 16, item 24)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEV_ONLY = ("toxiproxy", "requests", "matplotlib")

# Run in a child interpreter in which the dev extra's packages cannot be imported, as on a base
# install: a finder ahead of every other one refuses them.
BLOCKER = f"""
import sys

class _DevExtraMissing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {DEV_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)")
        return None

sys.meta_path.insert(0, _DevExtraMissing())
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCKER + code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_the_blocker_makes_the_dev_extra_unimportable() -> None:
    done = _run("import chaos.toxiproxy.client")
    assert done.returncode != 0
    assert "blocked by the test" in done.stderr


def test_chaos_run_help_needs_no_dev_extra() -> None:
    done = _run("from cli import main\nmain(['chaos', 'run', '--help'], prog_name='dledger')")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Usage: dledger chaos run" in done.stdout
    for option in ("--scenario", "--canary", "--seed", "--duration", "--out"):
        assert option in done.stdout
    assert "dev extra" not in done.stdout + done.stderr
