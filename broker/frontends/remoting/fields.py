"""Reading a remoting request's header fields (extFields, all strings on the wire; the C++ client
sends some as JSON numbers, which ``protocol.remoting.command`` turns into strings) with every
value checked, and the front end's named refusal (``RemotingRefusal``: a response code and a
remark that says which field and why), and the broker's named errors as response codes
(``code_of``)."""

from __future__ import annotations

from client import errors
from protocol.auth import AccessDeniedError, SignatureError
from protocol.broker_errors import BrokerError
from protocol.broker_kinds import INT_MAX
from protocol.envelope import RemoteError
from protocol.errors import DiskFullError
from protocol.remoting import codes

__all__ = ["RemotingRefusal", "boolean", "code_of", "integer", "text"]

INT32_MAX = 2**31 - 1


class RemotingRefusal(Exception):
    """A request answered with ``code`` and ``remark`` (never a crash, never a hang)."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


def text(ext: dict[str, str], name: str, default: str | None = None, max_len: int = 4096) -> str:
    value = ext.get(name, default)
    if value is None:
        raise RemotingRefusal(codes.INVALID_PARAMETER, f"the header field {name!r} is missing")
    if len(value) > max_len:
        raise RemotingRefusal(codes.INVALID_PARAMETER,
                              f"the header field {name!r} is longer than {max_len} characters")
    return value


def integer(ext: dict[str, str], name: str, default: int | None = None, lo: int = 0,
            hi: int = INT_MAX) -> int:
    raw = ext.get(name)
    if raw is None or raw == "":
        if default is None:
            raise RemotingRefusal(codes.INVALID_PARAMETER, f"the header field {name!r} is missing")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise RemotingRefusal(codes.INVALID_PARAMETER,
                              f"the header field {name!r} is not an integer: {raw[:40]!r}") from None
    if not lo <= value <= hi:
        raise RemotingRefusal(codes.INVALID_PARAMETER,
                              f"the header field {name!r} must be in {lo}..{hi}, not {value}")
    return value


def boolean(ext: dict[str, str], name: str) -> bool:
    return ext.get(name, "false").lower() == "true"


# A broker's named statuses as RocketMQ's response codes (anything else: SYSTEM_ERROR).
_STATUS_CODES = {
    "TOPIC_NOT_FOUND": codes.TOPIC_NOT_EXIST,
    "NO_PERMISSION": codes.NO_PERMISSION,
    "ACCESS_DENIED": codes.NO_PERMISSION,
    "SIGNATURE_REFUSED": codes.NO_PERMISSION,
    "INVALID_TOPIC": codes.MESSAGE_ILLEGAL,
    "MESSAGE_TOO_LARGE": codes.MESSAGE_ILLEGAL,
    "BAD_DELAY": codes.MESSAGE_ILLEGAL,
    "BAD_REQUEST": codes.INVALID_PARAMETER,
    "MESSAGE_NOT_FOUND": codes.QUERY_NOT_FOUND,
    "OVERLOADED": codes.SYSTEM_BUSY,
    "DISK_FULL": codes.SERVICE_NOT_AVAILABLE,
    "NOT_LEADER": codes.SERVICE_NOT_AVAILABLE,
    "TRANSFERRING": codes.SERVICE_NOT_AVAILABLE,
    "STOPPED": codes.SERVICE_NOT_AVAILABLE,
}


def code_of(err: Exception) -> int:
    """The response code for an error of the broker API, the forward or this front end."""
    if isinstance(err, RemotingRefusal):
        return err.code
    code = getattr(err, "code", None)
    if isinstance(err, BrokerError | RemoteError | SignatureError | AccessDeniedError) \
            and isinstance(code, str):
        return _STATUS_CODES.get(code, codes.SYSTEM_ERROR)
    if isinstance(err, DiskFullError | errors.RetriableError):
        return codes.SERVICE_NOT_AVAILABLE
    return codes.SYSTEM_ERROR
