"""The client protocol of a log server: request and response kinds over the shared framing.

Owns the kinds (>= 64, so they never collide with Raft's), the error codes and the pure
encode/decode of requests and responses. Every frame is ``[VERSION, kind, request_id, ...]``;
responses carry the request id so many requests can be in flight on one connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol.errors import (
    DiskFullError,
    DLedgerError,
    LeadershipLostError,
    LeadershipTransferInProgressError,
    MembershipChangeError,
    NodeStoppedError,
    NotLeaderError,
    OutcomeUnknownError,
    OverloadedError,
    ProposalTimeoutError,
    WireError,
)
from protocol.frames import decode_payload, encode_payload

PROPOSE = 64
PROPOSE_BATCH = 65
READ = 66
STATUS = 67
TRANSFER = 68
POWER_LOSS = 69
LOCAL_LOAD = 70  # benchmark only: run proposers inside the leader process
REQUEST_KINDS = {PROPOSE, PROPOSE_BATCH, READ, STATUS, TRANSFER, POWER_LOSS, LOCAL_LOAD}

RESULT = 80
ERROR = 81

MAX_PROPOSAL_BYTES = 4 << 20


class RemoteError(DLedgerError):
    """A server answered with an error code this client does not map to a specific error."""

    def __init__(self, code: str, message: str) -> None:
        # a service's message may already start with its code: say it once
        super().__init__(message if message.startswith(code) else f"{code}: {message}")
        self.code = code


class BadRequestError(DLedgerError):
    """The server refused a malformed or oversized request."""


class UnknownRequestKindError(WireError):
    """A well-formed request of a kind this server does not serve; answered under its id."""

    def __init__(self, kind: int, request_id: int) -> None:
        super().__init__(f"unknown request kind {kind}")
        self.request_id = request_id


_CODES: dict[type[DLedgerError], str] = {
    NotLeaderError: "NOT_LEADER",
    OverloadedError: "OVERLOADED",
    LeadershipTransferInProgressError: "TRANSFERRING",
    LeadershipLostError: "LEADERSHIP_LOST",
    ProposalTimeoutError: "TIMEOUT",
    OutcomeUnknownError: "OUTCOME_UNKNOWN",
    NodeStoppedError: "STOPPED",
    DiskFullError: "DISK_FULL",
    MembershipChangeError: "MEMBERSHIP_CHANGE_REFUSED",
    BadRequestError: "BAD_REQUEST",
    WireError: "BAD_REQUEST",
}


@dataclass(frozen=True, slots=True)
class Request:
    kind: int
    request_id: int
    args: list[Any]


@dataclass(frozen=True, slots=True)
class Response:
    request_id: int
    ok: bool
    result: Any = None
    code: str = ""
    message: str = ""
    leader_id: str | None = None
    term: int = 0  # of a NOT_LEADER answer: the answering node's term (0: not said)


def encode_request(kind: int, request_id: int, *args: Any) -> bytes:
    return encode_payload(kind, [request_id, *args])


def decode_request(payload: bytes, kinds: frozenset[int] | set[int] = frozenset(REQUEST_KINDS)) -> Request:
    """A request of one of ``kinds`` (the log server's by default; other services pass theirs)."""
    kind, fields = decode_payload(payload)
    if not fields or not isinstance(fields[0], int) or isinstance(fields[0], bool):
        raise WireError("request without an integer request id")
    if kind not in kinds:
        raise UnknownRequestKindError(kind, fields[0])
    return Request(kind, fields[0], fields[1:])


def encode_decode_error(err: WireError) -> bytes:
    """The answer to a request that did not decode: under its request id when it had one (an
    unknown kind), else under -1 (the caller cannot be told apart)."""
    return encode_error(err.request_id if isinstance(err, UnknownRequestKindError) else -1, err)


def encode_result(request_id: int, result: Any) -> bytes:
    return encode_payload(RESULT, [request_id, result])


def encode_error(request_id: int, err: Exception) -> bytes:
    """An error response. A service's own errors name their code in a ``code`` attribute.
    NOT_LEADER carries a fifth field, the node's term, so that a client can tell a fresh leader
    hint from a stale one (a node that has not heard of the latest election)."""
    code = getattr(err, "code", None) or next(
        (c for t, c in _CODES.items() if isinstance(err, t)), "ERROR")
    if isinstance(err, NotLeaderError):
        return encode_payload(ERROR, [request_id, code, str(err), err.leader_hint, err.term])
    return encode_payload(ERROR, [request_id, code, str(err), None])


def decode_response(payload: bytes) -> Response:
    """A response; an error response has four fields, or five (NOT_LEADER's term; servers
    older than that field send four, read as term 0)."""
    kind, fields = decode_payload(payload)
    if kind == RESULT and len(fields) == 2 and isinstance(fields[0], int):
        return Response(fields[0], True, fields[1])
    if kind == ERROR and len(fields) in (4, 5) and isinstance(fields[0], int):
        rid, code, message, leader = fields[:4]
        term = fields[4] if len(fields) == 5 else 0
        if (isinstance(code, str) and isinstance(message, str)
                and (leader is None or isinstance(leader, str))
                and type(term) is int and term >= 0):
            return Response(rid, False, code=code, message=message, leader_id=leader, term=term)
    raise WireError(f"malformed response of kind {kind}")


def error_from(resp: Response) -> DLedgerError:
    """The named client-side exception for an error response."""
    for t, c in _CODES.items():
        if c == resp.code and t is not WireError:
            if t is NotLeaderError:
                return NotLeaderError(resp.leader_id, resp.term)
            return t(resp.message)
    return RemoteError(resp.code, resp.message)
