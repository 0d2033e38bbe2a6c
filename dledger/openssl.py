"""Whether a server process loads OpenSSL: not when it serves without TLS.

asyncio imports ``ssl`` in every process, and ``hashlib`` and ``hmac`` import ``_hashlib``.
Either maps OpenSSL's libcrypto, and ``ssl`` adds its own objects: about 4.7 MiB of a broker's
33 MiB at start (docs/performance.md). A server whose command line and environment ask for no
TLS imports its modules inside ``unloaded_without_tls``:

- ``ssl`` is marked absent for the rest of the process. asyncio then runs as it does on a Python
  built without TLS, and any attempt at TLS fails with an ImportError naming ``ssl``, never by
  falling back to plain TCP;
- ``_hashlib`` is marked absent only while the modules load, so ``hashlib`` and ``hmac`` take
  CPython's built-in digests (BLAKE2b is the built-in one in any case). The one user that needs
  OpenSSL's speed, a snapshot's SHA-256 over the log's files, asks ``sha256()``, which loads
  OpenSSL then: the built-in SHA-256 is about ten times slower and holds the GIL while it runs.

What asks for TLS (``asks_for_tls``): any ``--tls...`` or ``--peer-mtls`` option, an ``https://``
address, ``DLEDGER_TLS_CA`` in the environment, or a ``--config`` file that says ``tls`` or
``https:`` anywhere (a key, a value or a comment: the file is read as text, not parsed) or cannot
be read. In doubt, OpenSSL loads as usual. Only a process's entry point calls this (``broker.__main__``),
never a module that tests or clients import.

uvloop imports ``ssl`` when it loads and keeps a few of its names for its TLS paths, so with
``ssl`` absent it would not load at all and the process would fall back to the standard loop
(it did, unnoticed, for a while). ``import_without_ssl`` loads such a module against a
placeholder ``ssl`` (``_AbsentSsl``) whose names can never make a TLS object, then marks ``ssl``
absent again: uvloop runs, plain sockets only, and OpenSSL stays unloaded.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NoReturn

__all__ = [
    "TLS_ENV",
    "SslAbsentError",
    "asks_for_tls",
    "import_without_ssl",
    "sha256",
    "unloaded_without_tls",
]

TLS_ENV = "DLEDGER_TLS_CA"  # (protocol.tls.ENV_CA: not imported here, it imports ssl)
_TLS_WORDS = ("--tls", "--peer-mtls", "https:")
_CONFIG_WORDS = ("tls", "https:")  # (``tls_cert``, ``tls-ca``, ``peer_mtls``, ...)
CONFIG_BYTES_MAX = 1 << 20  # a longer --config file counts as asking for TLS


def asks_for_tls(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether this command line or environment may want TLS (see the module)."""
    if environ.get(TLS_ENV):
        return True
    if any(word in arg.lower() for arg in argv for word in _TLS_WORDS):
        return True
    return any(_config_asks(path) for path in config_paths(argv))


def config_paths(argv: Sequence[str]) -> list[str]:
    """The files named by ``--config FILE`` or ``--config=FILE`` (a trailing ``--config``
    without a file: the empty path, which cannot be read)."""
    out = []
    for k, arg in enumerate(argv):
        if arg == "--config":
            out.append(argv[k + 1] if k + 1 < len(argv) else "")
        elif arg.startswith("--config="):
            out.append(arg.partition("=")[2])
    return out


def _config_asks(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            text = f.read(CONFIG_BYTES_MAX + 1)
    except OSError:
        return True  # (the command line reports the file's error by name)
    if len(text) > CONFIG_BYTES_MAX:
        return True
    lowered = text.decode("utf-8", errors="replace").lower()
    return any(word in lowered for word in _CONFIG_WORDS)


@contextlib.contextmanager
def unloaded_without_tls(argv: Sequence[str], environ: Mapping[str, str]) -> Iterator[bool]:
    """Import the process's modules inside this: without TLS asked for (and OpenSSL not loaded
    already), they load without it. Yields whether OpenSSL was left out."""
    leave_out = not asks_for_tls(argv, environ) and not {"ssl", "_hashlib"} & set(sys.modules)
    if leave_out:
        # (None in sys.modules: importing the name raises ImportError)
        sys.modules["ssl"] = None  # type: ignore[assignment]
        sys.modules["_hashlib"] = None  # type: ignore[assignment]
    try:
        yield leave_out
    finally:
        if leave_out and sys.modules.get("_hashlib", 0) is None:
            del sys.modules["_hashlib"]  # loadable again, by sha256() only


def sha256(data: bytes = b"") -> Any:
    """A SHA-256 hash object: OpenSSL's, loaded now if the process started without it, else (a
    Python without OpenSSL) the built-in one."""
    try:
        import _hashlib
    except ImportError:
        import hashlib  # (here, not at the top: imported before the gate, it would load OpenSSL)

        return hashlib.sha256(data)
    return _hashlib.openssl_sha256(data)


class SslAbsentError(ImportError):
    """TLS asked of a process that started without it (``unloaded_without_tls``)."""


def _refuse(*_: Any, **__: Any) -> NoReturn:
    raise SslAbsentError("this process started without TLS: ssl is not loaded")


class _AbsentSsl(types.ModuleType):
    """What a module that reads ``ssl``'s names as it loads finds instead: a class per class
    name that cannot be made (nor matched by an object of the real ``ssl``), a distinct negative
    number per constant (no real error code equals one), a function that refuses per function."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name.isupper():
            value: Any = -(1 << 20) - len(self.__dict__)  # (each name set below: a new one)
        elif name[:1].isupper():
            value = type(name, (Exception,), {"__init__": _refuse, "__module__": "ssl"})
        else:
            value = _refuse
        setattr(self, name, value)
        return value


def import_without_ssl(name: str) -> types.ModuleType:
    """Import module ``name``; if ``ssl`` is marked absent, against ``_AbsentSsl`` (then absent
    again). Whatever the module raises as it loads propagates (ImportError if it is missing)."""
    if sys.modules.get("ssl", 0) is not None:
        return importlib.import_module(name)
    sys.modules["ssl"] = _AbsentSsl("ssl")
    try:
        return importlib.import_module(name)
    finally:
        sys.modules["ssl"] = None  # type: ignore[assignment]
