"""How a server process logs: ``--log-format text|json`` and ``--log-level``, one event per line on
stderr, each carrying where it happened (group, node, term).

Owns the formatters and the context every record is stamped with. The context is a function the
process binds once its node exists (``bind_context``): it is read per record, so a record carries
the term current when it was logged. A JSON line has ``ts`` (UTC, ISO 8601 with milliseconds),
``level``, ``logger``, ``msg``, the context's fields, the call's ``extra`` fields when they are
plain values, and ``exc`` for an exception. The text format puts the context in brackets.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "JsonFormatter", "bind_context", "configure"]

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
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
        record.where = " ".join(f"{k}={v}" for k, v in ctx.items())
        return super().format(record)


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def configure(log_format: str = "text", level: str = "WARNING") -> None:
    """Log records of ``level`` and above to stderr in ``log_format``, replacing any handler."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"--log-format is one of {', '.join(LOG_FORMATS)}, not {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
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
