"""The installed client library is typed for its users: mypy, run outside the checkout on a file
that imports ``client``, finds the package and its ``py.typed`` marker and checks against the
library's own annotations (issue 16 item 24)."""

from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

PROBE = '''\
from client import Message, Producer

m = Message("t", b"x")
n: int = m.topic
p: str = Producer("127.0.0.1:9876")
'''


def _finder_editable_install() -> bool:
    """setuptools' default editable mode installs an import hook that type checkers cannot
    follow (the Makefile installs in "compat" mode, a plain .pth path, instead). Looked up in
    site-packages: the checkout's own dledger.egg-info would answer for the metadata."""
    return any(True for d in site.getsitepackages() for _ in Path(d).glob("__editable___dledger_*_finder.py"))


def test_mypy_outside_the_checkout_sees_the_client_types(tmp_path: Path) -> None:
    if _finder_editable_install():
        pytest.skip("editable install in setuptools' default mode, which hides the packages from "
                    "type checkers: reinstall with `make install-dev` (editable_mode=compat)")
    (tmp_path / "probe.py").write_text(PROBE)
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--cache-dir",
                          str(tmp_path / "cache"), "probe.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=240)
    text = out.stdout + out.stderr
    assert "Cannot find implementation" not in text and "missing library stubs" not in text, text
    assert 'probe.py:4: error: Incompatible types in assignment (expression has type "str", ' \
           'variable has type "int")' in text, text
    assert 'probe.py:5: error: Incompatible types in assignment (expression has type ' \
           '"Producer", variable has type "str")' in text, text
    assert "Found 2 errors in 1 file" in text, text
