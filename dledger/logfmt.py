"""How a server process logs: ``--log-format text|json``, ``--log-level`` (INFO by default) and
``--log-stream stderr|stdout`` (stderr by default; a container's image sets stdout, and JSON, through
``$DLEDGER_LOG_STREAM`` and ``$DLEDGER_LOG_FORMAT``), one event per line, each carrying where it
happened (group, node, term; the term is null until the node has read its state).

Owns the formatters, the context every record is stamped with, and the lines that open and close
a process's log (``log_start``: program, version and options, secrets never shown; ``log_stop``).
The context is a function the process binds once its node exists (``bind_context``): it is read
per record, so a record carries the term current when it was logged. A JSON line has ``ts``
(UTC, ISO 8601 with milliseconds), ``level``, ``logger``, ``msg``, the context's fields, the
call's ``extra`` fields when they are plain values, and ``exc`` for an exception. The text format
puts the context in brackets.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "LOG_LEVEL_DEFAULT", "LOG_STREAMS", "JsonFormatter", "bind_context",
           "configure", "log_start", "log_stop", "options_text", "program_version"]

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_LEVEL_DEFAULT = "INFO"
LOG_STREAMS = ("stderr", "stdout")
# Options a server reads from the environment when not given (the image sets them).
LOG_FORMAT_ENV = "DLEDGER_LOG_FORMAT"
LOG_STREAM_ENV = "DLEDGER_LOG_STREAM"
# Libraries whose INFO lines are per request or per connection: kept at WARNING unless DEBUG.
_CHATTY_LOGGERS = ("aiohttp.access", "aiohttp.server", "aiohttp.web", "asyncio", "grpc")
# An option whose name holds one of these carries a secret, unless it names a file or a path.
_SECRET_WORDS = ("secret", "password", "passwd", "token", "credential", "private", "cluster_key")
_PATH_SUFFIXES = ("_file", "_path", "_dir")
REDACTED = "<redacted>"
log = logging.getLogger("dledger.process")
Context = Callable[[], dict[str, Any]]

_context: Context | None = None
# The attributes every LogRecord has: anything else on a record came from ``extra=``.
_RECORD_FIELDS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "ctx"}


def bind_context(context: Context | None) -> None:
    """Stamp every record from now on with ``context()`` (None: no context)."""
    global _context
    _context = context


def _context_now() -> dict[str, Any]:
    context = _context
    if context is None:
        return {}
    try:
        return context()
    except Exception:  # a log call must never fail for want of its context
        return {}


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.ctx = _context_now()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        event: dict[str, Any] = {"ts": f"{ts}.{int(record.msecs):03d}Z",
                                 "level": record.levelname, "logger": record.name,
                                 "msg": record.getMessage()}
        event.update(getattr(record, "ctx", None) or {})
        for key, value in record.__dict__.items():
            if key not in _RECORD_FIELDS and key not in event and _plain(value):
                event[key] = value
        if record.exc_info:
            event["exc"] = self.formatException(record.exc_info)
        return json.dumps(event, separators=(",", ":"), default=str)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ctx = getattr(record, "ctx", None) or {}
        record.where = " ".join(f"{k}={v}" for k, v in ctx.items() if v is not None)
        return super().format(record)


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def configure(log_format: str = "text", level: str = LOG_LEVEL_DEFAULT, stream: str = "stderr") -> None:
    """Log records of ``level`` and above to ``stream`` (stderr or stdout) in ``log_format``,
    replacing any handler."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"--log-format is one of {', '.join(LOG_FORMATS)}, not {log_format!r}")
    if stream not in LOG_STREAMS:
        raise ValueError(f"--log-stream is one of {', '.join(LOG_STREAMS)}, not {stream!r}")
    handler = logging.StreamHandler(sys.stdout if stream == "stdout" else sys.stderr)
    handler.addFilter(_ContextFilter())
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(_TextFormatter(
            "%(asctime)s %(levelname)s %(name)s [%(where)s] %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in _CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if level.upper() == "DEBUG"
                                         else logging.WARNING)


def program_version() -> str:
    """dledger's version (``dledger.__version__``, which the installed metadata is built from)."""
    from dledger import __version__
    return __version__


def options_text(params: Mapping[str, Any]) -> str:
    """``name=value`` for each option that has a value, in order; the value of an option named
    for a secret (``_SECRET_WORDS``) shown as ``<redacted>`` unless the option names a file or a
    path (a path is no secret: what is in the file is never read here)."""
    parts = []
    for name, value in params.items():
        if value is None or value == () or value == "":
            continue
        secret = any(w in name.lower() for w in _SECRET_WORDS) and not name.endswith(_PATH_SUFFIXES)
        if secret:
            shown = REDACTED
        elif isinstance(value, (tuple, list)):
            shown = ",".join(str(v) for v in value)
        else:
            shown = str(value)
        parts.append(f"{name}={shown}")
    return " ".join(parts)


def log_start(program: str, params: Mapping[str, Any]) -> None:
    """The first line of a server process: program, version, pid and options (no secrets)."""
    version = program_version()
    log.info("%s %s starting (pid %d, Python %s): %s", program, version, os.getpid(),
             platform.python_version(), options_text(params),
             extra={"program": program, "version": version, "pid": os.getpid()})


def log_stop(program: str, started_at_s: float, why: str, failure: BaseException | None = None
             ) -> None:
    """The last line of a server process: why it stopped and after how long; at ERROR with the
    failure when it stopped on one (so that the log's last line names it)."""
    uptime_s = round(time.monotonic() - started_at_s, 1)
    if failure is None:
        log.info("%s stopped (%s) after %.1f s", program, why, uptime_s,
                 extra={"program": program, "uptime_s": uptime_s})
    else:
        log.error("%s stopped (%s) after %.1f s: %s: %s", program, why, uptime_s,
                  type(failure).__name__, failure,
                  extra={"program": program, "uptime_s": uptime_s})
