"""The seeded bugs of the live chaos runs (docs/testing.md): each test-only flag, the scenario
whose checkers must catch it and the run's settings for it. The flags themselves live with the
code they break (``--broker-canary``, ``--canary`` of a node, the client's canaries); the tests
(``tests/chaos/test_chaos_canaries.py``) and ``dledger chaos run --canaries`` run each here."""

from __future__ import annotations

from typing import Any

from chaos.live.nemesis import s13_corruption

# Seeded bugs (docs/testing.md) and the scenario that must catch each.
CANARIES: dict[str, tuple[str, dict[str, Any]]] = {
    "commit_without_quorum": ("S1", {}),  # ack on the leader's own copy: lost after isolation
    # acknowledge from the page cache, fsync later (async flush, as DLedger does by default):
    # the same S12 that loses nothing in sync mode must lose acknowledged messages here. The
    # flush interval is long (5 s) so that a power loss of all nodes finds acknowledged bytes
    # unsynced on every node: with 1 s, the three nodes' flush phases left a window of a few
    # messages, and a 30 s CI run with two power losses once lost none.
    "async_flush_ack": ("S12", {"flush_mode": "async", "async_flush_ms": 5000}),
    "no_pre_vote_check_quorum": ("S3", {}),  # leader churn under a partial partition
    "skip_checksum": ("S13", {"schedule": s13_corruption(("bitflip",))}),
    # a client-side bug (client.cluster.routes.CANARIES): the producer keeps dialling the silent old leader
    "stale_leader": ("S16", {}),
    # broker bugs in the messaging features (chaos.live.features.driver), caught by their checkers:
    "delay_early": ("S1", {}),  # timers delivered 3 s early: the delay checker's "early"
    "timer_redeliver": ("S6", {}),  # a new leader delivers every timer again: "twice"
    "lock_unfenced": ("S8", {}),  # a held queue lock granted to another member: "overlap"
    # the reconsume count kept in the leader's memory: after a leader kill a message's retry
    # copies carry a count that went back and it is retried too often ("count", "attempts")
    "retry_count_lost": ("S6", {}),
    # transactions (chaos.live.features.txn): a half message stored in its real queue at once,
    # consumed before its COMMIT and even when rolled back ("txn: early", "txn: rolled back")
    "txn_half_visible": ("S1", {}),
    # a new leader forgets the transactions open when it took over: never checked back, the
    # UNKNOWN ones stay open and their commits are lost ("txn: unresolved", "txn: lost")
    "txn_forget": ("S6", {}),
    # a killed node's restart keeps the consume-queue units written after its checkpoint, and
    # the replay of the log appends them again: its queues hold messages twice, at offsets the
    # other replicas give to other messages (broker.core.cq_files)
    "cq_keep_tail": ("S6", {}),
    # the replicas store a retried send again (the dedup table never finds its unique key): a
    # send whose answer was lost is stored twice by the library's retry (broker.core.state)
    "dedup_ignored": ("S21", {}),
    # the leader dedups by the sender's key alone (broker.core.sendwire.SCOPE_CANARIES): the
    # producers' values under a shared key are answered as one another's duplicates, never
    # stored ("lost")
    "dedup_key_only": ("S1", {}),
    # the remoting endpoint acknowledges a 4.x send before it is stored: lost with the leader
    # (caught on the 4.x producers' sends: its run leaves the orderly pipeline out, whose
    # consumers would wait out their bound for the acknowledged messages that never came)
    "remoting_ack_early": ("S18", {"remoting_orderly": False}),
    # a restarted node forgets the membership changes its log holds (chaos.live.membership)
    "membership_forget_on_restart": ("S17", {}),
    # the NameServer takes registrations without checking their signature: the forger beside
    # every run (chaos.live.forger) gets its forgeries accepted ("registrations: accepted")
    "namesrv_skip_signature": ("S1", {}),
    # the pop table forgets a message group's message in flight when it hands out the group's
    # next one: two of one group in flight at once ("fifo: overlap", chaos.live.grpc_load)
    "fifo_group_overlap": ("S19", {}),
    # the gRPC endpoint stores a batch's first half alone and answers it failed ("batch torn")
    "grpc_batch_torn": ("S19", {}),
    # a recall is answered OK and its timer left pending: the recalled delayed message is
    # delivered at its due time ("recall: delivered", chaos.live.grpc_timed)
    "recall_ignored": ("S19", {}),
    # the leader's receive skips the TTL check: the slow consumer gets messages past their TTL
    # ("ttl: expired", chaos.live.grpc_timed)
    "ttl_ignored": ("S19", {}),
    # a new leader forgets the parked set (the lower priorities a receive passed over): those
    # messages are never handed out ("pop: acknowledged send ... never received")
    "priority_park_lost": ("S19", {}),
}
