"""A secret reaches the ``dledger`` command from the environment or a private file, never its
command line (``cli.secrets``): typed there it is refused, saying where to put it; a file
others may read is refused; from the environment or a 0600 file it is taken."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import cli
from protocol.auth import SECRET_KEY_ENV

NAMES = ("DLEDGER_ACCESS_KEY", SECRET_KEY_ENV, "DLEDGER_ACL_NEW_SECRET")


@pytest.fixture(autouse=True)
def _own_environment() -> Iterator[None]:
    """The credentials' variables unset during a test, and as they were after it: the command
    puts what it was given into this process's environment, which the worker's next tests
    share (a leaked account would have their clients sign)."""
    before = {name: os.environ.pop(name, None) for name in NAMES}
    yield
    for name, value in before.items():
        os.environ.pop(name, None)
        if value is not None:
            os.environ[name] = value


def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    res = CliRunner().invoke(cli.main, list(args), env=env)
    return res.exit_code, res.output


def test_a_secret_on_the_command_line_is_refused_and_says_where_to_put_it() -> None:
    code, out = _run("--access-key", "root", "--secret-key", "s3cret-value", "tls", "--help")
    assert code == 2 and "--secret-key on the command line is refused" in out
    assert f"${SECRET_KEY_ENV}" in out and "--secret-key-file" in out
    assert "s3cret-value" not in out
    code, out = _run("acl", "put", "bob", "--new-secret", "bob-secret-1", "--namesrv", "x:1")
    assert code == 2 and "--new-secret on the command line is refused" in out
    assert "bob-secret-1" not in out


def test_a_secret_from_the_environment_or_a_private_file_is_taken(tmp_path: Path) -> None:
    assert _run("--access-key", "root", "tls", "--help",
                env={SECRET_KEY_ENV: "from-the-env"})[0] == 0
    path = tmp_path / "root.secret"
    path.write_text("from-a-file\n")
    os.chmod(path, 0o600)
    assert _run("--access-key", "root", "--secret-key-file", str(path), "tls", "--help")[0] == 0
    assert os.environ.get(SECRET_KEY_ENV) == "from-a-file"  # (the client library reads it there)
    del os.environ[SECRET_KEY_ENV]
    os.chmod(path, 0o644)
    code, out = _run("--secret-key-file", str(path), "tls", "--help")
    assert code == 2 and "readable by others" in out and "from-a-file" not in out
    code, out = _run("acl", "put", "bob", "--namesrv", "x:1")
    assert code == 2 and "DLEDGER_ACL_NEW_SECRET" in out
