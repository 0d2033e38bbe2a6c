"""The remoting endpoint for RocketMQ 4.x clients (``--remoting-listen``): the listener, one
connection's requests, and the table of request codes it serves, a thin adapter over the
in-process broker API (``broker.api.api.BrokerApi``).

Each request becomes requests of the broker's kinds: on the group's leader served in this process;
on a follower a write (a send, an offset commit, a lock) is forwarded once to the leader
(``broker.frontends.forward``), as a 4.x client sends to the address its route names and does not
follow redirects; reads of committed data (pulls, offsets by time) are served where they arrive.
Concurrent sends travel to the API together (``broker.frontends.gather``). The sends are
``broker.frontends.remoting.sends``', the consuming requests ``broker.frontends.remoting.consume``'s.

Every request gets an answer: a code not served is REQUEST_CODE_NOT_SUPPORTED, a refusal its
RocketMQ response code with a remark naming the reason (``RemotingRefusal``, the API's named
errors by ``code_of``). A frame that is not a command closes the connection; a connection with
``IN_FLIGHT_MAX`` requests under way has the next answered SYSTEM_BUSY; one whose client does not
take its answers is read no further past ``OUTPUT_HIGH_BYTES`` unread, and cut off past
``OUTPUT_MAX_BYTES`` (requests it had pipelined meanwhile). A connection that closes
takes its consumers out of their groups at once (as a RocketMQ broker does on a closed channel),
but for those live on another connection (a client that reconnected).

The node's own requests to a client go on the client's connection: the check-back (39, oneway),
NOTIFY_CONSUMER_IDS_CHANGED (40, oneway), and an operator's GET_CONSUMER_RUNNING_INFO (307) and
CONSUME_MESSAGE_DIRECTLY (309), whose answers come back under their opaque (``ask``).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from typing import TYPE_CHECKING, Any

from broker.api.api import ACTING, FORWARD_TIMEOUT_S, BrokerApi, acting_as
from broker.features.txn.model import HALF_TOPIC, REAL_QID, REAL_TOPIC
from broker.frontends.forward import LeaderForward, RoutesOnce
from broker.frontends.gather import SendGather
from broker.frontends.remoting import consume, lookup, sends, txn
from broker.frontends.remoting.consume import record_of
from broker.frontends.remoting.fields import RemotingRefusal, code_of
from broker.frontends.remoting.host import Handler
from broker.frontends.remoting.lookup import found_record
from broker.frontends.remoting.signature import signed_by
from client import errors
from client.cluster.routes import Routes
from protocol.broker_errors import BrokerError, ClientNoAnswerError
from protocol.broker_kinds import SEND, message_id
from protocol.errors import DLedgerError, WireError
from protocol.framed import ConnectionLimits, FramedProtocol
from protocol.remoting import codes, loose_json
from protocol.remoting.command import Command, RemotingFrameError, decode, encode

if TYPE_CHECKING:
    from broker.api.broker import Broker

__all__ = ["IN_FLIGHT_MAX", "RemotingConnection", "RemotingServer"]

log = logging.getLogger("broker.remoting")

Address = tuple[str, int]
IN_FLIGHT_MAX = 1024  # requests under way on one connection (a push consumer's pulls and sends)
ANSWER_TEXT_MAX = 1 << 20  # of a client's answer that is not JSON, kept
OUTPUT_HIGH_BYTES = 8 << 20  # answers not yet taken by the client: read no more requests
OUTPUT_LOW_BYTES = 1 << 20  # ... until it has taken them down to this
OUTPUT_MAX_BYTES = 64 << 20  # a client that leaves more unread (pipelined pulls) is cut off

def client_answer(answer: Command) -> dict[str, Any]:
    """A client's answer to 307 / 309: its JSON body (``loose_json``: RocketMQ's clients write
    maps keyed by objects; the text as given if even that does not read), or its refusal by
    name."""
    if answer.code != codes.SUCCESS:
        raise ClientNoAnswerError(f"the client refused ({answer.code}): {answer.remark or ''}")
    text = answer.body.decode("utf-8", "replace")
    try:
        body = loose_json.loads(text) if text else {}
    except (ValueError, RecursionError):
        return {"text": text[:ANSWER_TEXT_MAX]}
    return body if isinstance(body, dict) else {"value": body}


class RemotingConnection(FramedProtocol):
    """One 4.x client's connection to this node."""

    def __init__(self, server: RemotingServer) -> None:
        super().__init__(limits=server.limits)
        self.server = server
        self.in_flight = 0
        self.consumers: set[tuple[str, str]] = set()  # (client id, group) heard on it
        # groups it asked the members of before any consumer of them heartbeat on it (told
        # when one joins: ``consume.heart_beat``)
        self.listed_unjoined: set[str] = set()
        self.subscriptions: dict[tuple[str, str], tuple[str, str]] = {}  # (their heartbeats')
        self.peer: str = ""
        self.closing = False
        self.asked: dict[int, asyncio.Future[Command]] = {}  # this node's requests, by opaque

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else ""
        if self.transport is not None:
            self.transport.set_write_buffer_limits(OUTPUT_HIGH_BYTES, OUTPUT_LOW_BYTES)

    def pause_writing(self) -> None:
        """The client is not taking its answers: read no more of its requests meanwhile."""
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def payload_received(self, payload: bytes) -> None:
        if self.closing:
            return  # (frames that came in the same read as a malformed one)
        try:
            cmd = decode(payload)
        except RemotingFrameError as err:
            self.note_error("bad remoting frame", err)
            self.server.refused_frames += 1
            self.closing = True
            if self.transport is not None:
                self.transport.close()
            return
        if cmd.is_response:
            asked = self.asked.pop(cmd.opaque, None)
            if asked is not None and not asked.done():
                asked.set_result(cmd)
            return  # (an answer to a oneway request of ours, or one given up on)
        if self.in_flight >= IN_FLIGHT_MAX:
            self.reply(cmd, cmd.response(codes.SYSTEM_BUSY,
                                         f"{IN_FLIGHT_MAX} requests under way on this connection"))
            return
        self.in_flight += 1
        task = asyncio.get_running_loop().create_task(self._serve(cmd))
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    async def _serve(self, cmd: Command) -> None:
        try:
            response = await self.server.serve(self, cmd)
        finally:
            self.in_flight -= 1
        if response is None:
            return
        try:
            self.reply(cmd, response)
        except (ValueError, TypeError) as err:  # (an answer that does not encode: a bug of ours)
            log.error("remoting answer to request %d does not encode: %s", cmd.code, err)

    def reply(self, cmd: Command, response: Command) -> None:
        if cmd.is_oneway or not self.alive:
            return
        assert self.transport is not None
        if self.queued_bytes > OUTPUT_MAX_BYTES:
            self.note_error("answers unread", f"closed with {self.queued_bytes} bytes of "
                            "answers unread")
            self.server.refused_frames += 1
            self.transport.abort()
            return
        self.send_payload(encode(response))

    def framing_failed(self, err: WireError) -> None:
        self.server.refused_frames += 1  # (noted by the base)

    def check_transaction(self, group: str, producer_group: str, txn_id: str, checks: int,
                          messages: list[list[Any]]) -> None:
        """The check-back's question to a 4.x producer: CHECK_TRANSACTION_STATE (oneway), the
        transaction's first half message as a record in the body."""
        if not messages:
            return
        row = messages[0]
        props = dict(row[5])
        cmd = txn.check_request(self.server.store_host, txn_id, row)
        cmd.opaque = next(self.server.opaques)
        cmd.body = record_of(self.server.store_host, props.get(REAL_TOPIC, HALF_TOPIC),
                             int(props.get(REAL_QID, "0") or 0), row)
        self.send_payload(encode(cmd))

    async def ask(self, cmd: Command) -> Command:
        """A request of this node's to the client, and its answer (the caller bounds the
        wait; the connection closing fails it)."""
        if not self.alive or len(self.asked) >= IN_FLIGHT_MAX:
            raise ClientNoAnswerError(f"the connection from {self.peer} is closed or busy")
        cmd.opaque = next(self.server.opaques)
        answer: asyncio.Future[Command] = asyncio.get_running_loop().create_future()
        self.asked[cmd.opaque] = answer
        try:
            self.send_payload(encode(cmd))
            return await answer
        finally:
            self.asked.pop(cmd.opaque, None)

    async def running_info(self, group: str, client_id: str) -> dict[str, Any]:
        """GET_CONSUMER_RUNNING_INFO (307) to the consumer: its answer's body."""
        answer = await self.ask(Command(codes.GET_CONSUMER_RUNNING_INFO, ext={
            "consumerGroup": group, "clientId": client_id, "jstackEnable": "false"}))
        return client_answer(answer)

    async def consume_directly(self, group: str, client_id: str,
                               found: list[Any]) -> dict[str, Any]:
        """CONSUME_MESSAGE_DIRECTLY (309) to the consumer, the message as a record."""
        answer = await self.ask(Command(codes.CONSUME_MESSAGE_DIRECTLY, ext={
            "consumerGroup": group, "clientId": client_id, "brokerName": self.server.broker.group,
            "msgId": message_id(found[8], found[9])},
            body=found_record(self.server.store_host, found)))
        return client_answer(answer)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        for asked in self.asked.values():
            if not asked.done():
                asked.set_exception(ClientNoAnswerError(f"the connection from {self.peer} "
                                                        "closed before the client answered"))
        self.server.broker.txns.producers.drop(self)  # its producers can no longer be asked
        self.server.broker.consumers.drop(self)
        gone, self.consumers = self.consumers, set()
        others = [c for c in self.server.limits.open
                  if isinstance(c, RemotingConnection) and c is not self]
        gone = {pair for pair in gone if not any(pair in c.consumers for c in others)}
        for client_id, group in gone:  # gone with its connection (unless live on another)
            self.server.broker.heartbeat(client_id, group, "clustering", {}, 0)
        for group in {g for _, g in gone}:
            self.server.consumers_changed(group)


class RemotingServer:
    """One broker node's remoting endpoint (see the module docstring)."""

    def __init__(self, broker: Broker, listen: Address) -> None:
        self.broker = broker
        self.listen = listen
        config = broker.config
        tls = config.node.tls
        self.tls = tls
        self.routes = Routes(list(config.namesrv),
                             ssl_context=tls.dial_context() if tls is not None else None,
                             from_env=False)
        self.forward = LeaderForward(broker.group, self.routes, self._ensure_routes)
        self.api = BrokerApi(broker, forward=self.forward)
        self.gather = SendGather(self.api.send_runs, FORWARD_TIMEOUT_S)
        self.gathers: dict[str, SendGather] = {}  # with --acl: one per account (its forwards)
        self.limits = ConnectionLimits(config.max_connections, config.input_buffer_bytes_max)
        self.store_host: Address = listen  # the registered address: in the message ids
        self.handlers: dict[int, Handler] = {**sends.HANDLERS, **consume.HANDLERS,
                                             **lookup.HANDLERS, **txn.HANDLERS}
        self.opaques = itertools.count(1)  # of the requests this node sends to clients
        self.tasks: set[asyncio.Task[None]] = set()  # requests being served
        self.requests = 0
        self.refused_frames = 0
        self.unsupported = 0
        self.notices = 0  # consumer-list changes told to a group's consumers
        self.refusals: dict[str, int] = {}  # "request code:response code" -> count
        self._server: asyncio.Server | None = None
        self._routes_once = RoutesOnce(self.routes)

    async def start(self) -> Address:
        host, port = self.listen
        self._server = await asyncio.get_running_loop().create_server(
            lambda: RemotingConnection(self), host, port,
            ssl=self.tls.server_context() if self.tls is not None else None)
        bound = self._server.sockets[0].getsockname()
        return bound[0], bound[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for conn in list(self.limits.open):
            if conn.transport is not None:
                conn.transport.abort()
        tasks, self.tasks = list(self.tasks), set()
        for task in tasks:  # long polls and forwards under way
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.gather.close()
        await self.forward.close()
        await self._routes_once.close()

    async def _ensure_routes(self) -> None:
        await self._routes_once.ensure()

    async def serve(self, conn: RemotingConnection, cmd: Command) -> Command | None:
        """The answer to one request (None: nothing to send back)."""
        self.requests += 1
        handler = self.handlers.get(cmd.code)
        if handler is None:
            self.unsupported += 1
            return cmd.response(codes.REQUEST_CODE_NOT_SUPPORTED,
                                f"request code {cmd.code} is not supported by this broker")
        try:
            if not self.broker.config.acl:
                return await handler(self, conn, cmd)
            with acting_as(signed_by(cmd, self._secret_of)):  # (this request's task only)
                return await handler(self, conn, cmd)
        except (RemotingRefusal, BrokerError, DLedgerError, errors.ClientError) as err:
            return self._refused(cmd, code_of(err), str(err))
        except Exception as err:  # a bug of ours: answered, logged, the connection lives on
            log.exception("remoting request %d failed", cmd.code)
            return self._refused(cmd, codes.SYSTEM_ERROR, f"{type(err).__name__}: {err}")

    def _refused(self, cmd: Command, code: int, remark: str) -> Command:
        key = f"{cmd.code}:{code}"
        self.refusals[key] = self.refusals.get(key, 0) + 1
        log.debug("remoting request %d from %s refused (%d): %s", cmd.code, cmd.language,
                  code, remark)
        return cmd.response(code, remark[:1000])

    async def call(self, kind: int, *args: Any, connection: Any = None) -> Any:
        """One request of the broker's kinds through the API (forwarded from a follower);
        ``connection``: the client's, for the kinds that keep it (a producer's heartbeat)."""
        return await self.api.call(kind, *args, connection=connection)

    def consumers_changed(self, group: str, joined: object = None) -> None:
        """NOTIFY_CONSUMER_IDS_CHANGED to the group's consumers connected here (oneway), unless
        the broker runs --no-notify-consumers; not to ``joined``, the connection whose consumer
        just joined: it rebalances once its heartbeats are out (a notice from each node it
        reaches would start rebalances while it still connects to the others, and the C++
        client then fails requests on its own connection table's lock: an offset query failed
        so starts that queue at its end, past the backlog)."""
        if not self.broker.config.notify_consumers:
            return
        for conn in list(self.limits.open):
            if isinstance(conn, RemotingConnection) and conn.alive and conn is not joined \
                    and any(g == group for _, g in conn.consumers):
                notice = Command(codes.NOTIFY_CONSUMER_IDS_CHANGED, next(self.opaques),
                                 codes.FLAG_ONEWAY, ext={"consumerGroup": group})
                conn.send_payload(encode(notice))
        self.notices += 1

    def gathered_send(self, topic: str, queue_id: int, row: list[Any],
                      queues_asked: int | None = None) -> asyncio.Future[list[Any]]:
        """One message to the API with the concurrent sends of other requests (with --acl,
        of the same account's: judged, and forwarded, as that account). ``queues_asked``: the
        client's defaultTopicQueueNums, for a topic the send creates."""
        if not self.broker.config.acl:
            return self.gather.send(topic, queue_id, row, queues_asked)
        key = ACTING.get()
        if key is None:
            raise RemotingRefusal(codes.NO_PERMISSION, "access control is on: sign requests")
        # judged alone first: a refused send must not fail the others it would travel with
        self.broker.acl.permit(key, SEND, [topic, queue_id, [row]], leader_rule=False)
        gather = self.gathers.get(key)
        if gather is None:
            gather = self.gathers[key] = SendGather(
                functools.partial(self._send_runs_as, key), FORWARD_TIMEOUT_S)
        return gather.send(topic, queue_id, row, queues_asked)

    async def _send_runs_as(self, access_key: str, runs: list[list[Any]],
                            timeout_s: float) -> list[Any]:
        with acting_as(access_key):
            return await self.api.send_runs(runs, timeout_s)

    def _secret_of(self, access_key: str) -> str | None:
        account = self.broker.acl.account(access_key)
        return None if account is None else account.secret_key

    def status(self) -> dict[str, Any]:
        return {"requests": self.requests, "unsupported": self.unsupported,
                "consumer_notices": self.notices, "refusals": dict(self.refusals),
                "refused_frames": self.refused_frames, "connections": self.limits.stats(),
                "send_requests": self.gather.requests, "forwarded": self.api.forwarded}
