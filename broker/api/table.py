"""Every request handler of the broker, in one place: the request table by kind (``TABLE``) and
the kinds a broker serves (``SERVED_KINDS``: the table's and the sends'). Adding a request kind:
its number in ``protocol.broker_kinds``, a ``@handles`` function in its feature's ``handlers``
module and, for a new module, one line here."""

from __future__ import annotations

import broker.api.handlers as core
import broker.features.acl.handlers as acl
import broker.features.admin.handlers as admin
import broker.features.clients.handlers as clients
import broker.features.delay.handlers as delay
import broker.features.membership.handlers as membership
import broker.features.orderly.handlers as orderly
import broker.features.pop.handlers as pop
import broker.features.query.handlers as query
import broker.features.retry.handlers as retry
import broker.features.txn.handlers as txn
from broker.core.requests import Handler, table_of
from protocol.broker_kinds import SEND_KINDS

__all__ = ["SERVED_KINDS", "TABLE"]

TABLE: dict[int, Handler] = table_of(core.HANDLERS, retry.HANDLERS, orderly.HANDLERS,
                                     txn.HANDLERS, query.HANDLERS, admin.HANDLERS,
                                     membership.HANDLERS, pop.HANDLERS, acl.HANDLERS,
                                     clients.HANDLERS, delay.HANDLERS)
SERVED_KINDS = frozenset({*SEND_KINDS, *TABLE})
