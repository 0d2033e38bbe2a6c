"""Our own client protocol on a broker node's client port (``NativeFrontend``): frames in
(``protocol.framed``), each request admitted by access control, then served by the broker API
(``broker.api.api``) without forwarding (our clients follow NOT_LEADER redirects themselves), and
its answer or named error out under its request id.

The sends take a hot path (``broker.api.sendpath``: no task per request, answered once the
entry is applied); every other kind runs as a task. A connection that closes drops the producers
it registered (they can no longer be asked about their transactions) and the consumers told of
their group's changes on it (CONSUMER_IDS_CHANGED frames, ``broker.features.clients``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from broker.api.api import BrokerApi
from broker.api.broker import Broker
from broker.api.table import SERVED_KINDS
from protocol.auth import SIGNED, AccessDeniedError, SignatureError
from protocol.broker_errors import BadEntryError, BadRequestError, BrokerError
from protocol.broker_kinds import CHECK_TRANSACTION, CONSUMER_IDS_CHANGED, SEND_KINDS
from protocol.envelope import (
    Request,
    decode_request,
    encode_decode_error,
    encode_error,
    encode_result,
)
from protocol.errors import DLedgerError, NotLeaderError, WireError
from protocol.framed import ConnectionLimits, FramedProtocol
from protocol.frames import encode_payload
from protocol.group_client import Address

__all__ = ["ACCEPTED_KINDS", "NativeFrontend"]

ACCEPTED_KINDS = SERVED_KINDS | {SIGNED}  # a signed envelope wraps one of the served kinds


class RefusalCounter:
    """Where access refusals are counted (``broker.shell.metrics``; nowhere by default)."""

    def refused(self, err: Exception) -> None:
        return


class _Connection(FramedProtocol):
    def __init__(self, frontend: NativeFrontend) -> None:
        super().__init__(limits=frontend.limits)
        self.frontend = frontend
        self.tasks: set[asyncio.Task[None]] = set()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.frontend.broker.txns.producers.drop(self)  # its producers can no longer be asked
        self.frontend.broker.consumers.drop(self)  # nor its consumers told

    def check_transaction(self, group: str, producer_group: str, txn_id: str, checks: int,
                          messages: list[list[Any]]) -> None:
        """The check-back's question to a producer of ours: a CHECK_TRANSACTION frame."""
        self.send_payload(encode_payload(CHECK_TRANSACTION, [group, producer_group, txn_id,
                                                             checks, messages]))

    def consumer_ids_changed(self, group: str) -> None:
        """The notice to a consumer of ours that its group changed: a CONSUMER_IDS_CHANGED frame."""
        self.send_payload(encode_payload(CONSUMER_IDS_CHANGED, [group]))

    def payload_received(self, payload: bytes) -> None:
        try:
            req = decode_request(payload, ACCEPTED_KINDS)
        except WireError as err:
            self.send_payload(encode_decode_error(err))
            return
        frontend = self.frontend
        acl = frontend.broker.acl
        if acl.enabled or req.kind == SIGNED:
            try:
                req = acl.admit(req)
            except NotLeaderError as err:  # a new leader still applying (broker.features.acl)
                self.send_payload(encode_error(req.request_id, err))
                return
            except (SignatureError, AccessDeniedError, BadRequestError) as err:
                frontend.refusals.refused(err)
                self.send_payload(encode_error(req.request_id, err))
                return
        if req.kind in SEND_KINDS and frontend.broker.sends.handle(req, self):
            return
        task = asyncio.ensure_future(frontend.handle(req, self))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


class NativeFrontend:
    """The client port of one broker node."""

    def __init__(self, broker: Broker, listen: Address, limits: ConnectionLimits) -> None:
        self.broker = broker
        self.api = BrokerApi(broker)  # no forwarding: our clients follow redirects
        self.listen = listen
        self.limits = limits
        self.refusals: Any = RefusalCounter()
        self._server: asyncio.Server | None = None
        self.address: Address | None = None

    async def start(self) -> Address:
        tls = self.broker.config.node.tls
        host, port = self.listen
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Connection(self), host, port, ssl=tls.server_context() if tls else None)
        sock = self._server.sockets[0].getsockname()
        self.address = (sock[0], sock[1])
        return self.address

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def handle(self, req: Request, conn: _Connection) -> None:
        try:
            result = await self.api.local(req.kind, req.args, conn)
        except (DLedgerError, BrokerError) as err:
            conn.send_payload(encode_error(req.request_id, err))
        except (TypeError, ValueError, IndexError, OverflowError, KeyError, AttributeError) as err:
            conn.send_payload(encode_error(req.request_id, BadEntryError(f"bad request: {err}")))
        else:
            conn.send_payload(encode_result(req.request_id, result))
