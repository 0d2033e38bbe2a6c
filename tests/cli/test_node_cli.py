"""The node command line's config file: TOML values become option defaults, the command line
still wins, and bad files are refused with the file and the key named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from click.testing import CliRunner

from dledger.node_cli import node_config, node_options


@click.command()
@node_options
@click.option("--listen", default="127.0.0.1:10911")
def show(listen: str, **opts: Any) -> None:
    cfg = node_config(opts)
    click.echo(f"{cfg.group} {cfg.node_id} {sorted(cfg.peers.items())} {cfg.data_dir} "
               f"{cfg.flush_mode} {cfg.tick_interval_s} {listen}")


def _config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "node.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_config_file_supplies_the_options(tmp_path: Path) -> None:
    path = _config(tmp_path, '''
group = "a"
id = "n1"
data-dir = "/tmp/n1"
flush_mode = "async"
listen = "127.0.0.1:20911"
[peers]
n0 = "127.0.0.1:7000"
n1 = "127.0.0.1:7001"
''')
    out = CliRunner().invoke(show, ["--config", path])
    assert out.exit_code == 0, out.output
    assert out.output.split() == ["a", "n1", "[('n0',", "('127.0.0.1',", "7000)),", "('n1',",
                                  "('127.0.0.1',", "7001))]", "/tmp/n1", "async", "0.1",
                                  "127.0.0.1:20911"]


def test_the_command_line_overrides_the_file(tmp_path: Path) -> None:
    path = _config(tmp_path, 'group = "a"\nid = "n0"\npeers = "n0=127.0.0.1:7000"\n'
                             f'data_dir = "{tmp_path / "x"}"\nflush-mode = "async"\ntick-ms = 50\n')
    out = CliRunner().invoke(show, ["--flush-mode", "sync", "--config", path])
    assert out.exit_code == 0, out.output
    assert out.output.split()[-3:] == ["sync", "0.05", "127.0.0.1:10911"]


def test_an_unknown_key_or_a_broken_file_is_refused_by_name(tmp_path: Path) -> None:
    out = CliRunner().invoke(show, ["--config", _config(tmp_path, 'group = "a"\nflush = "x"\n')])
    assert out.exit_code == 2 and "unknown setting 'flush'" in out.output
    out = CliRunner().invoke(show, ["--config", _config(tmp_path, "group = \n")])
    assert out.exit_code == 2 and "node.toml" in out.output
    out = CliRunner().invoke(show, ["--config", str(tmp_path / "missing.toml")])
    assert out.exit_code == 2 and "missing.toml" in out.output
