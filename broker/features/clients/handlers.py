"""CONSUMER_RUNNING_INFO and CONSUME_DIRECTLY (``protocol.broker_kinds``), in the request table
(``broker.api.table``): a consumer connected to this node asked on its own connection
(``broker.features.clients.service``). Any replica serves them (the consumer is where it
heartbeats); CONSUME_DIRECTLY reads the message from this node's log, so it is asked of a node of
the message's group."""

from __future__ import annotations

from typing import Any, Protocol

from broker.core.requests import Handler, handlers, text
from broker.features.clients.service import ConsumerConnections
from broker.features.query.handlers import offset_msg_id
from broker.features.query.lookup import Lookup, LookupHost
from protocol.broker_kinds import CONSUME_DIRECTLY, CONSUMER_RUNNING_INFO

HANDLERS: list[Handler] = []
handles = handlers(HANDLERS)

CLIENT_ID_MAX_CHARS = 255


class ClientsHost(LookupHost, Protocol):
    @property
    def consumers(self) -> ConsumerConnections: ...


@handles(CONSUMER_RUNNING_INFO, group=text(), client_id=text(CLIENT_ID_MAX_CHARS))
async def consumer_running_info(broker: ClientsHost, group: str,
                                client_id: str) -> dict[str, Any]:
    conn = broker.consumers.connection(group, client_id, broker.config.node.node_id)
    return await broker.consumers.ask("its running information", client_id,
                                      conn.running_info(group, client_id))


@handles(CONSUME_DIRECTLY, group=text(), client_id=text(CLIENT_ID_MAX_CHARS),
         offset_msg_id=offset_msg_id)
async def consume_directly(broker: ClientsHost, group: str, client_id: str,
                           offset_id: str) -> dict[str, Any]:
    conn = broker.consumers.connection(group, client_id, broker.config.node.node_id)
    found = Lookup(broker).view(offset_id)
    return await broker.consumers.ask(f"consuming {offset_id}", client_id,
                                      conn.consume_directly(group, client_id, found))
