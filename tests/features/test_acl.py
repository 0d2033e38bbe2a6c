"""Access control's pure parts: signatures and the replay guard (``protocol.auth``), accounts and
permissions (``broker.features.acl.model``), its log entries and checkpoint, and the request table
(``broker.features.acl.service.NEEDS``) covering every kind a broker serves."""

from __future__ import annotations

import pytest

from broker.api.table import SERVED_KINDS
from broker.features.acl.entries import AclDelete, AclPut
from broker.features.acl.model import DENY, PUB, PUB_SUB, SUB, Account, AclTable, Need, parse_perm, permits
from broker.features.acl.service import NEEDS
from broker.machine.kinds import decode, encode
from broker.machine.state import BrokerState
from protocol.auth import (
    SIGNED,
    Credentials,
    ReplayGuard,
    SignatureError,
    Signer,
    parse_signed,
)
from protocol.broker_errors import BadEntryError
from protocol.envelope import encode_request
from protocol.frames import decode_payload

ALICE = Credentials("alice", "alice-secret-1")


def signed(signer: Signer, target: str = "n0", kind: int = 100, *args: object) -> tuple[int, list]:
    payload = signer.wrap(7, target, encode_request(kind, 7, *args))
    k, fields = decode_payload(payload)
    assert k == SIGNED
    return fields[0], fields[1:]


def test_a_signature_verifies_with_the_secret_and_not_with_another() -> None:
    rid, fields = signed(Signer(ALICE), "n0", 100, "orders", 0, [])
    req = parse_signed(rid, fields)
    assert req.access_key == "alice" and req.target == "n0" and req.seq == 1
    assert req.verify("alice-secret-1")
    assert not req.verify("alice-secret-2")
    forged = parse_signed(rid, [*fields[:6], fields[6][:-1] + b"x"])  # another request body
    assert not forged.verify("alice-secret-1")


@pytest.mark.parametrize("broken", [
    lambda f: f[:-1],                                   # a field short
    lambda f: [1, *f[1:]],                              # key not a string
    lambda f: ["a b", *f[1:]],                          # key with a space
    lambda f: [f[0], 5, *f[2:]],                        # target not a string
    lambda f: [*f[:2], b"short", *f[3:]],               # session length
    lambda f: [*f[:3], 0, *f[4:]],                      # seq not positive
    lambda f: [*f[:3], True, *f[4:]],                   # a bool is no integer
    lambda f: [*f[:4], -5, *f[5:]],                     # ts negative
    lambda f: [*f[:5], b"\x00" * 31, f[6]],             # signature length
    lambda f: [*f[:6], "text"],                         # inner not bytes
])
def test_a_malformed_envelope_is_a_signature_error(broken: object) -> None:
    rid, fields = signed(Signer(ALICE))
    with pytest.raises(SignatureError):
        parse_signed(rid, broken(fields))  # type: ignore[operator]


def test_the_replay_guard_refuses_stale_clocks_replays_and_too_many_sessions() -> None:
    guard = ReplayGuard(window_ms=10_000, sessions_max=2)
    s1, s2, s3 = Signer(ALICE, clock_s=lambda: 100.0), Signer(ALICE, clock_s=lambda: 100.0), \
        Signer(ALICE, clock_s=lambda: 100.0)
    first = parse_signed(*signed(s1))
    guard.check(first, 100_000)
    with pytest.raises(SignatureError, match="replayed"):
        guard.check(first, 100_001)
    guard.check(parse_signed(*signed(s1)), 100_002)  # the next of the session
    with pytest.raises(SignatureError, match="clock"):
        guard.check(parse_signed(*signed(s2)), 100_000 + 10_001)  # too old for the node
    with pytest.raises(SignatureError, match="clock"):
        guard.check(parse_signed(*signed(s2)), 100_000 - 10_001)  # from the future
    guard.check(parse_signed(*signed(s2)), 100_000)
    with pytest.raises(SignatureError, match="too many"):
        guard.check(parse_signed(*signed(s3)), 100_000)
    # once the remembered sessions are older than the window, a new one takes their place
    late = Signer(ALICE, clock_s=lambda: 120.0)
    guard.check(parse_signed(*signed(late)), 120_000)
    assert len(guard) == 1


def test_one_account_cannot_crowd_out_the_others_nor_lock_out_an_admin() -> None:
    guard = ReplayGuard(window_ms=10_000, sessions_max=3, per_key_max=2)
    now = lambda: 100.0  # noqa: E731
    for _ in range(2):
        guard.check(parse_signed(*signed(Signer(ALICE, clock_s=now))), 100_000)
    with pytest.raises(SignatureError, match="too many"):  # alice's cap
        guard.check(parse_signed(*signed(Signer(ALICE, clock_s=now))), 100_000)
    bob = Credentials("bob", "bob-secret-1")
    guard.check(parse_signed(*signed(Signer(bob, clock_s=now))), 100_000)  # bob still gets one
    with pytest.raises(SignatureError, match="too many"):  # the node's cap
        guard.check(parse_signed(*signed(Signer(bob, clock_s=now))), 100_000)
    root = Credentials("root", "root-secret-1")
    guard.check(parse_signed(*signed(Signer(root, clock_s=now))), 100_000, exempt=True)
    assert len(guard) == 4


def test_credentials_hide_their_secret_and_come_from_the_environment() -> None:
    assert "alice-secret-1" not in repr(ALICE) and "alice" in repr(ALICE)
    env = {"DLEDGER_ACCESS_KEY": "bob", "DLEDGER_SECRET_KEY": "bob-secret"}
    assert Credentials.from_env(env) == Credentials("bob", "bob-secret")
    assert Credentials.from_env({}) is None
    with pytest.raises(ValueError, match="both"):
        Credentials.from_env({"DLEDGER_ACCESS_KEY": "bob"})
    with pytest.raises(ValueError, match="secret"):
        Credentials("bob", "short")


def test_permissions_follow_rocketmq_plain_acl() -> None:
    assert [parse_perm(p) for p in ("DENY", "pub", "SUB", "PUB|SUB", "SUB|PUB")] == \
        [DENY, PUB, SUB, PUB_SUB, PUB_SUB]
    with pytest.raises(ValueError):
        parse_perm("ALL")
    a = Account("alice", "alice-secret-1", default_topic_perm=DENY, default_group_perm=SUB,
                topic_perms=(("logs", SUB), ("orders", PUB)), group_perms=(("billing", DENY),))
    assert permits(a, [Need("topic", "orders", PUB)]) is None
    assert "SUB on topic 'orders'" in str(permits(a, [Need("topic", "orders", SUB)]))
    assert permits(a, [Need("topic", "logs", SUB)]) is None
    assert permits(a, [Need("topic", "other", PUB)]) is not None  # the default: DENY
    assert permits(a, [Need("group", "shipping", SUB)]) is None  # the default: SUB
    assert permits(a, [Need("group", "billing", SUB)]) is not None
    assert permits(a, [Need("topic", "%RETRY%shipping", SUB)]) is None  # its group's
    assert permits(a, [Need("topic", "%DLQ%billing", SUB)]) is not None
    assert permits(a, [Need("admin")]) == "an admin operation"
    reader = Account("bob", "bob-secret", default_topic_perm=SUB)
    assert permits(reader, [Need("topic", "SCHEDULE_TOPIC_XXXX", SUB)]) is not None  # the broker's
    assert permits(reader, [Need("topic", "RMQ_SYS_TRANS_HALF_TOPIC", SUB)]) is not None
    assert permits(reader, [Need("topic", "RMQ_SYS_TRACE_TOPIC", SUB)]) is None  # as its default
    assert permits(reader, [Need("group", "any", SUB)]) is not None  # groups: DENY by default
    root = Account("root", "root-secret", admin=True)
    assert permits(root, [Need("admin"), Need("topic", "x", PUB_SUB)]) is None
    with pytest.raises(ValueError, match="sorted"):
        Account("bob", "bob-secret", topic_perms=(("b", PUB), ("a", PUB)))
    with pytest.raises(ValueError):
        Account("bob", "bob-secret", default_topic_perm=7)


def test_acl_entries_apply_alike_and_survive_the_checkpoint() -> None:
    a = Account("alice", "alice-secret-1", False, DENY, SUB, (("orders", PUB),), ())
    put = encode(AclPut(5, a))
    assert decode(put) == AclPut(5, a)
    state = BrokerState()
    assert state.apply(1, 0, put).status == "OK"
    assert state.acl.get("alice") == a
    assert state.apply(2, 0, encode(AclDelete(6, "bob"))).status == "ACCOUNT_NOT_FOUND"
    restored = BrokerState.restore(state.snapshot())
    assert restored.acl.get("alice") == a and restored.snapshot() == state.snapshot()
    assert state.apply(3, 0, encode(AclDelete(7, "alice"))).status == "OK"
    assert state.acl.get("alice") is None
    # a malformed entry is refused alike on every replica, never a crash
    bad = put.replace(b"alice-secret-1", b"short\x00\x00\x00\x00\x00\x00\x00\x00\x00")
    assert state.apply(4, 0, bad).status == "BAD_ENTRY"
    with pytest.raises(BadEntryError):
        decode(bad)


def test_acl_table_rows_are_validated_on_restore() -> None:
    table = AclTable()
    table.put(Account("alice", "alice-secret-1"))
    assert AclTable.restore(table.snapshot()).accounts == table.accounts
    with pytest.raises(ValueError):
        AclTable.restore([["alice", "alice-secret-1", "yes", 0, 2, [], []]])


def test_every_request_kind_a_broker_serves_has_a_permission_rule() -> None:
    assert set(SERVED_KINDS) <= set(NEEDS), sorted(set(SERVED_KINDS) - set(NEEDS))
