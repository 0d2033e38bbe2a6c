"""The features' parts of the broker's state, by name: how each is made new and restored from its
checkpoint state (``PARTS``, in checkpoint order), and the state machine's seeded bugs
(``STATE_CANARIES``, each feature's own)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.core.state import DEDUP_CANARIES, Part, StateConfig
from broker.features.acl.apply import PART as ACL
from broker.features.acl.model import AclTable
from broker.features.admin.apply import PART as SUBSCRIPTION_GROUPS
from broker.features.admin.model import SubscriptionGroups
from broker.features.delay.apply import DELAY_STATE_CANARIES
from broker.features.delay.apply import PART as DELAY
from broker.features.delay.model import DelayIndex
from broker.features.orderly.apply import ORDERLY_STATE_CANARIES
from broker.features.orderly.apply import PART as ORDERLY
from broker.features.orderly.model import LockTable
from broker.features.pop.apply import PART as POP
from broker.features.pop.model import POP_CANARIES, PopTable
from broker.features.txn.apply import PART as TXN
from broker.features.txn.apply import TXN_STATE_CANARIES
from broker.features.txn.model import TxnTable

__all__ = ["ACL", "DELAY", "ORDERLY", "PARTS", "POP", "STATE_CANARIES", "SUBSCRIPTION_GROUPS",
           "TXN"]

CHECKPOINT_VERSION = 8  # 8: each feature's state under its name; 1-7: broker.machine.legacy
# Seeded bugs of the state machine (tests only, on every replica alike), by feature.
STATE_CANARIES = (DELAY_STATE_CANARIES | ORDERLY_STATE_CANARIES | TXN_STATE_CANARIES
                  | POP_CANARIES | DEDUP_CANARIES)

# feature name -> (a new part, the part restored from its checkpoint state), in checkpoint order
PARTS: dict[str, tuple[Callable[[StateConfig], Part], Callable[[Any, StateConfig], Part]]] = {
    DELAY: (lambda c: DelayIndex(), lambda blob, c: DelayIndex.restore(blob)),
    ORDERLY: (lambda c: LockTable(), lambda blob, c: LockTable.restore(blob)),
    TXN: (lambda c: TxnTable(), lambda blob, c: TxnTable.restore(blob)),
    POP: (lambda c: PopTable(c.canaries & POP_CANARIES),
          lambda blob, c: PopTable.restore(blob, c.canaries & POP_CANARIES)),
    ACL: (lambda c: AclTable(), lambda blob, c: AclTable.restore(blob)),
    SUBSCRIPTION_GROUPS: (lambda c: SubscriptionGroups(),
                          lambda blob, c: SubscriptionGroups.restore(blob)),
}
