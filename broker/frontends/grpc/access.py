"""Access control at the gRPC endpoint (``--acl``): every call of ``MessagingService`` is
authenticated by its RocketMQ 5 signature (``broker.frontends.grpc.signature``) before the
gateway's handler runs, and the handler then runs as that account (``broker.api.api.ACTING``), so
every request it makes of the broker API is judged by the account's permissions, exactly as our
own clients' and the 4.x endpoint's are, and a follower forwards it to the leader signed as the
same account (``broker.frontends.forward``).

A call whose signature is refused gets its RPC's own response with the protocol's UNAUTHORIZED
status and the reason as its message (the official clients raise ``UnauthorizedException`` with
it); a streaming call (ReceiveMessage, Telemetry) gets one such message and ends. A permission the
account lacks is the broker API's ``AccessDeniedError``: FORBIDDEN (``codec.code_of``).

The account is handed to the handler through the call's ``contextvars`` context: gRPC runs the
interceptors and then the handler of one call in one context of its own, which starts empty
(``grpc.aio.ServerInterceptor``'s contract), so the account set here is that call's alone.

Owns the interceptor, the refusal count and the refusal log (rate-limited, naming the call, the
client id and the reason, never a secret), and what the gateway's own requests need of the ACL:
an account's secret (``secret_reader``) and the signing of its transaction heartbeats
(``txn_signing``). Must not let a call through unauthenticated.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from grpc import aio
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as sv

from broker.api.api import ACTING
from broker.features.acl.model import PUB, Need, permits
from broker.frontends.grpc.codec import status
from broker.frontends.grpc.signature import signed_by
from broker.frontends.grpc.txn import Signing, txn_group
from client.cluster.routes import Routes
from protocol.auth import Credentials, SignatureError

if TYPE_CHECKING:
    import ssl

    from broker.features.acl.service import AclService

__all__ = ["RESPONSES", "AccessInterceptor", "refusal", "secret_reader", "txn_signing"]

log = logging.getLogger("broker.grpc")

_SERVICE = sv.DESCRIPTOR.services_by_name["MessagingService"]
# "/apache.rocketmq.v2.MessagingService/SendMessage" -> SendMessageResponse, one per RPC
RESPONSES: dict[str, Any] = {f"/{_SERVICE.full_name}/{m.name}": getattr(sv, m.output_type.name)
                             for m in _SERVICE.methods}
REFUSALS_LOGGED_PER_S = 10  # refusal lines a node writes per second (the rest are counted)


def refusal(handler: Any, response: Any, text: str) -> Any:
    """``handler`` answering UNAUTHORIZED in ``response`` instead of running (a streaming call:
    that one message, then its end)."""
    answer = response(status=status(pb.Code.UNAUTHORIZED, text))

    async def once(request: Any, context: Any) -> Any:
        return answer

    async def stream(request: Any, context: Any) -> Any:
        yield answer

    if handler.response_streaming:
        field = "stream_stream" if handler.request_streaming else "unary_stream"
        return handler._replace(**{field: stream})
    field = "stream_unary" if handler.request_streaming else "unary_unary"
    return handler._replace(**{field: once})


class AccessInterceptor(aio.ServerInterceptor):
    """``secret_of``: an account's secret (None: no such account), read at each call, so an ACL
    change applies to the next call; ``window_ms``: the replay window."""

    def __init__(self, secret_of: Callable[[str], str | None], window_ms: int) -> None:
        self.secret_of = secret_of
        self.window_ms = window_ms
        self.admitted = 0
        self.refused = 0
        self._log_second = 0
        self._logged = 0

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                details: Any) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None  # not a method this server has: gRPC answers UNIMPLEMENTED
        response = RESPONSES.get(details.method)
        if response is None:  # (only MessagingService is served: a bug if it ever shows)
            raise RuntimeError(f"{details.method} has no refusal answer")
        try:
            key = self.authenticate(details.invocation_metadata or ())
        except SignatureError as err:
            self.refused += 1
            self._log(details.method, details.invocation_metadata or (), err)
            return refusal(handler, response, str(err))
        self.admitted += 1
        ACTING.set(key)  # (the call's own context: see the module docstring)
        return handler

    def authenticate(self, metadata: Any) -> str:
        now_s = time.time()
        return signed_by(metadata, self.secret_of, int(now_s * 1000), self.window_ms,
                         time.localtime(now_s).tm_gmtoff)

    def _log(self, method: str, metadata: Any, err: SignatureError) -> None:
        now_s = int(time.monotonic())
        if now_s != self._log_second:
            self._log_second, self._logged = now_s, 0
        if self._logged >= REFUSALS_LOGGED_PER_S:
            return
        self._logged += 1
        client = next((str(v) for k, v in metadata if k == "x-mq-client-id"), "-")
        log.warning("gRPC call refused: %s from client %s: %s", method.rsplit("/", 1)[-1],
                    client[:128], err, extra={"refusal": "signature"})


def secret_reader(acl: AclService) -> Callable[[str], str | None]:
    """An account's secret as the node's ACL has it now (None: no such account)."""
    def secret_of(access_key: str) -> str | None:
        account = acl.account(access_key)
        return None if account is None else account.secret_key
    return secret_of


def txn_signing(acl: AclService, namesrv: list[str],
                ssl_context: ssl.SSLContext | None) -> Signing:
    """How the gateway's transaction heartbeats are signed (``broker.frontends.grpc.txn``): as
    an account that may publish the topic's transactions (PUB on the topic and on its group
    ``%RMQ5_TXN%<topic>``), through a ``Routes`` of its own."""
    def may_publish(access_key: str | None, topic: str) -> bool:
        account = acl.account(access_key) if access_key is not None else None
        return account is not None and permits(account, [
            Need("topic", topic, PUB), Need("group", txn_group(topic), PUB)]) is None

    def routes_as(credentials: Credentials) -> Routes:
        return Routes(namesrv, ssl_context=ssl_context, credentials=credentials, from_env=False)
    return Signing(may_publish, acl.credentials, routes_as)
