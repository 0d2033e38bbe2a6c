"""The installed client library is typed for its users: mypy, run outside the checkout on a file
that imports ``client``, finds the package and its ``py.typed`` marker and checks against the
library's own annotations (issue 16 item 24). The editable install ``make up`` and ``make test``
do is a plain path, installed without a warning block (issue 34 item 5)."""

from __future__ import annotations

import site
import subprocess
import sys
import venv
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
    """An editable install by an import hook, which type checkers cannot follow (what setuptools
    makes of a checkout whose pyproject.toml does not name its package-dir; it now does). Looked
    up in site-packages: the checkout's own dledger.egg-info would answer for the metadata."""
    return any(True for d in site.getsitepackages() for _ in Path(d).glob("__editable___dledger_*_finder.py"))


def test_mypy_outside_the_checkout_sees_the_client_types(tmp_path: Path) -> None:
    if _finder_editable_install():
        pytest.skip("an editable install by an import hook, which hides the packages from type "
                    "checkers: reinstall with `make install-dev`")
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


def test_the_editable_install_is_a_plain_path_and_says_nothing(tmp_path: Path) -> None:
    """``pip install -e`` of the checkout, as the Makefile runs it, into a fresh environment: no
    setuptools warning block (the "compat" mode printed 15 lines), and a .pth naming the checkout
    rather than an import hook."""
    root = Path(__file__).resolve().parent.parent
    venv.create(tmp_path / "env", with_pip=True)
    pip = tmp_path / "env" / "bin" / "pip"
    out = subprocess.run([str(pip), "install", "-q", "--no-deps", "--disable-pip-version-check",
                          "-e", str(root)], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    said = [line for line in (out.stdout + out.stderr).splitlines()
            if "Location 'file:" not in line]  # (this machine's pip configuration, not ours)
    assert said == [], "\n".join(said)
    site_dir = next((tmp_path / "env" / "lib").glob("python3*/site-packages"))
    assert not list(site_dir.glob("__editable___dledger_*_finder.py"))
    paths = [p.read_text().split() for p in site_dir.glob("__editable__.dledger-*.pth")]
    assert paths == [[str(root)]]
