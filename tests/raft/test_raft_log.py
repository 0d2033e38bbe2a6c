"""RaftLog (the core's view of its log: durable entries, a cache of recent ones, unstable ones)
against a plain list, under random appends, truncations, persistence, cache releases and reads."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.raft.log import RaftLog
from dledger.raft.types import Entry, EntryKind
from dledger.storage.memstore import MemoryLogStore

ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(0, 6), st.integers(1, 4)),  # (cut back k, n new)
    st.tuples(st.just("persist"), st.integers(0, 10), st.integers(0, 0)),
    st.tuples(st.just("read"), st.integers(0, 40), st.integers(1, 2000)),
    st.tuples(st.just("release"), st.integers(0, 40), st.integers(0, 0)),  # (up to index a)
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops=ops, cache_bytes_max=st.sampled_from([0, 100, 500, 1 << 20]))
def test_raft_log_reads_match_a_plain_list(ops, cache_bytes_max: int) -> None:
    store = MemoryLogStore()
    log = RaftLog(store, cache_bytes_max=cache_bytes_max)
    model: list[Entry] = []
    term = 1
    for op, a, b in ops:
        if op == "append":
            term += 1
            after = max(0, len(model) - a)
            new = [Entry(after + k + 1, term, EntryKind.NORMAL, bytes([k]) * (k * 10))
                   for k in range(b)]
            log.append(new)
            model = model[:after] + new
        elif op == "persist" and log.unstable:
            upto = min(log.last_index(), log.unstable_offset + a)
            batch = [e for e in log.unstable if e.index <= upto]
            store.append(batch)  # what the shell does with Ready.entries
            log.stable_to(upto)
        elif op == "read":
            lo = min(a, len(model)) + 1 if model else 1
            got = log.slice(lo, len(model) + 1, b)
            want = model[lo - 1:]
            assert got == want[: len(got)]
            assert got or not want
        elif op == "release":
            log.release_cache_to(a)  # what the core does once entries are applied and matched
            assert all(e.index > a for e in log._cache[log._cache_head:])
        assert log.cache_bytes == sum(e.size_bytes for e in log._cache[log._cache_head:])
        assert log.last_index() == len(model)
        for e in model[-3:]:
            assert log.term_at(e.index) == e.term
