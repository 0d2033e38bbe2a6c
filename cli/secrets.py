"""Where the ``dledger`` command takes a secret from: the environment or a private file, never
its command line (every user of the machine can read a command line: ``ps``, ``/proc``).

Owns the rule and its message: an option that holds a secret (``--secret-key``,
``acl put --new-secret``) is read from its environment variable; given on the command line it is
refused, saying where to put it instead; its ``-file`` twin names a file that only its owner may
read (mode 0600), whose first line is the secret.
"""

from __future__ import annotations

import os
import stat

import click
from click.core import ParameterSource

__all__ = ["SECRET_FILE_BYTES_MAX", "secret_option_value"]

SECRET_FILE_BYTES_MAX = 4096


def _read_private(path: str, option: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            mode = os.fstat(f.fileno()).st_mode
            text = f.read(SECRET_FILE_BYTES_MAX + 1)
    except (OSError, UnicodeDecodeError) as err:
        raise click.BadParameter(f"cannot read {path}: {err}", param_hint=option) from err
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise click.BadParameter(f"{path} is readable by others (mode {stat.S_IMODE(mode):o}): "
                                 "chmod 600 it", param_hint=option)
    if len(text) > SECRET_FILE_BYTES_MAX:
        raise click.BadParameter(f"{path} holds more than {SECRET_FILE_BYTES_MAX} bytes: not a "
                                 "secret", param_hint=option)
    lines = text.splitlines()
    return lines[0] if lines else ""


def secret_option_value(ctx: click.Context, name: str, value: str | None,
                        file: str | None, env: str) -> str | None:
    """The secret of option ``--<name>`` (``value``, from ``$env``) or of its file twin
    ``--<name>-file``; a value typed on the command line is refused."""
    option = "--" + name.replace("_", "-")
    if value is not None and ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
        raise click.UsageError(
            f"{option} on the command line is refused: every user of this machine can read a "
            f"command line (ps, /proc). Put the secret in ${env}, or in a file only you can "
            f"read and give {option}-file FILE.")
    if file is not None:
        if value is not None:
            raise click.UsageError(f"give {option}-file or ${env}, not both")
        return _read_private(file, f"'{option}-file'")
    return value
