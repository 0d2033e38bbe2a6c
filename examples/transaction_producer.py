"""Transactional messages: ``TransactionProducer`` and ``ICBCTransactionListener`` of the RocketMQ
study notes.

Each message is first stored as a half message, invisible to consumers; then the listener's
``execute_local_transaction`` runs (the bank's debit) and its answer ends the transaction: TAGA
commits (the message becomes visible), TAGB rolls back (it never will), TAGC answers UNKNOWN, so
the broker checks back after its transaction timeout (``--transaction-timeout-s``, 6 s by
default) and ``check_local_transaction`` commits it then. The producer keeps running until that
check-back has come (a check-back goes to a live producer of the same producer group, ``tpg``),
or ``--timeout-s`` passes. Consume with ``other_consumer.py --topic TTopic --count 2``: it gets
Hi,0 and Hi,2, never Hi,1.
Run: ``python examples/transaction_producer.py``.
"""

from __future__ import annotations

import sys
import threading

from support import arguments, sent

from client import (
    Message,
    ReceivedMessage,
    SyncTransactionProducer,
    TransactionState,
)


class ICBCTransactionListener:
    def __init__(self) -> None:
        self.checked = threading.Event()

    def execute_local_transaction(self, message: Message, arg: object) -> TransactionState:
        print(f"half message stored: tags={message.tags} body={message.body.decode()!r}")
        # TAGA: the debit succeeded; TAGB: it failed; TAGC: not known, to be checked back
        if message.tags == "TAGA":
            return TransactionState.COMMIT
        if message.tags == "TAGB":
            return TransactionState.ROLLBACK
        return TransactionState.UNKNOWN

    def check_local_transaction(self, message: ReceivedMessage) -> TransactionState:
        print(f"check-back: tags={message.tags} -> COMMIT")
        self.checked.set()
        return TransactionState.COMMIT


def main() -> int:
    parser = arguments(__doc__, topic="TTopic", count=3)
    parser.add_argument("--timeout-s", type=float, default=60.0,
                        help="give up waiting for the check-back (exit 1) after this long")
    args = parser.parse_args()
    listener = ICBCTransactionListener()
    tags = ["TAGA", "TAGB", "TAGC"]
    with SyncTransactionProducer(args.namesrv, "tpg", listener) as producer:
        for i in range(args.count):
            msg = Message(args.topic, f"Hi,{i}".encode(), tags=tags[i % 3])
            result = producer.send(msg)
            print(f"{result.state.value} {sent(result.half)}")
        if args.count >= 3 and not listener.checked.wait(args.timeout_s):
            print(f"no check-back within {args.timeout_s} s", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
