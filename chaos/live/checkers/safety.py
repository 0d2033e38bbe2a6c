"""The safety checkers of a live chaos run (docs/testing.md): it owns the verdict of one L2 run, decided
offline from what the harness recorded - the client history, each replica's final committed log,
the drain through the leader and the nodes' trace events.

Checks: lost, lost_on_replica, replica divergence (split brain), inconsistent offsets, duplicates
(protocol vs retry), unexpected and failed-but-read values, recovered (informational), order
(producer FIFO, real-time, consumer monotonicity), stale and phantom reads of committed consumer
offsets (``chaos.live.checkers.registers``) and the Raft trace invariants (via
``chaos.traces.check``). Liveness numbers come from ``chaos.live.checkers.availability`` and never fail a run,
except the optional bounds on leader changes and on availability under a silent leader
(``chaos.live.silence``).

Pure: no I/O, no clock, no asyncio; sets, dicts and sorts, O(n log n) in the size of the record.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from chaos import traces
from chaos.live.checkers.availability import availability, leadership
from chaos.live.checkers.registers import check_offset_reads
from chaos.live.silence import SilenceBound, check_silence

MAX_EXAMPLES = 10
Dump = dict[int, list[tuple[int, str]]]
Obs = tuple[str, int, int, str]  # (source, queue, offset, value)
DRAIN = "leader_drain"


@dataclass(frozen=True)
class Finding:
    """One check's outcome: how many anomalies, the first few, and check-specific detail."""

    count: int = 0
    examples: list[Any] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)


def _finding(items: list[Any], **detail: Any) -> Finding:
    return Finding(len(items), items[:MAX_EXAMPLES], detail)


@dataclass
class Send:
    """One value's send: its invoke and outcome; no recorded outcome counts as ``info``."""

    value: str
    proc: str
    outcome: str = "info"
    t_invoke: float | None = None
    t_done: float | None = None
    queue: int | None = None
    offset: int | None = None
    node: str | None = None

    def order_key(self) -> tuple[float, int]:
        t = self.t_invoke if self.t_invoke is not None else (self.t_done or 0.0)
        seq = self.value.rsplit("-", 1)[-1]
        return t, int(seq) if seq.isdigit() else 0


@dataclass(frozen=True)
class Observed:
    """The run indexed once: sends by value, and every (source, queue, offset, value) observation."""

    sends: dict[str, Send]
    reads: list[Obs]  # polls, replicas, drain
    acks: list[Obs]
    replicas: dict[str, Dump]
    drain: Dump
    polls: list[dict[str, Any]]

    def read_values(self) -> set[str]:
        return {v for _, _, _, v in self.reads}

    def ok(self) -> list[Send]:
        return sorted((s for s in self.sends.values() if s.outcome == "ok"), key=Send.order_key)

    def outcome(self, value: str) -> str:
        send = self.sends.get(value)
        return send.outcome if send else "never sent"


def _int(x: Any) -> int | None:
    return None if x is None else int(x)


def observe(history: list[dict[str, Any]], replicas: dict[str, Dump], leader_drain: Dump) -> Observed:
    """Index the run once for the ``check_*`` functions (one pass over history and dumps)."""
    sends: dict[str, Send] = {}
    reads: list[Obs] = []
    polls = []
    for ev in history:
        if ev.get("f") == "send":
            s = sends.setdefault(ev["value"], Send(ev["value"], str(ev.get("proc"))))
            if ev["type"] == "invoke":
                s.t_invoke = float(ev["t"])
            else:
                s.outcome, s.t_done = ev["type"], float(ev["t"])
                if ev["type"] == "ok":
                    s.queue, s.offset, s.node = _int(ev.get("queue")), _int(ev.get("offset")), ev.get("node")
        elif ev.get("f") == "poll":
            polls.append(ev)
            if ev["type"] == "ok":
                reads += [(f"poll {ev['proc']}", int(ev["queue"]), int(o), v) for o, v in ev["values"]]
    dumps = [*((f"replica {n}", d) for n, d in sorted(replicas.items())), (DRAIN, leader_drain)]
    for source, dump in dumps:
        reads += [(source, int(q), int(o), v) for q, entries in dump.items() for o, v in entries]
    acks = [(f"ack {s.proc}", s.queue, s.offset, s.value) for s in sends.values()
            if s.outcome == "ok" and s.queue is not None and s.offset is not None]
    return Observed(sends, reads, acks, replicas, leader_drain, polls)


def _send_record(s: Send) -> dict[str, Any]:
    return {"value": s.value, "proc": s.proc, "queue": s.queue, "offset": s.offset, "node": s.node,
            "t_ack": s.t_done}


def check_lost(obs: Observed) -> Finding:
    """Acked values read nowhere; per producer split into lost prefix/middle/postfix (in invoke
    order, around the first and last surviving value; a producer with none surviving is all prefix)."""
    read = obs.read_values()
    by_proc: dict[str, list[Send]] = defaultdict(list)
    for s in obs.ok():
        by_proc[s.proc].append(s)
    lost: list[Send] = []
    split: dict[str, dict[str, int]] = {}
    for proc, sends in sorted(by_proc.items()):
        kept = [i for i, s in enumerate(sends) if s.value in read]
        first, last = (kept[0], kept[-1]) if kept else (len(sends), -1)
        parts = {"prefix": 0, "middle": 0, "postfix": 0}
        for i, s in enumerate(sends):
            if s.value not in read:
                lost.append(s)
                parts["prefix" if i < first else "postfix" if i > last else "middle"] += 1
        if any(parts.values()):
            split[proc] = parts
    return _finding([_send_record(s) for s in lost], per_producer=split)


def check_lost_on_replica(obs: Observed) -> dict[str, Finding]:
    """Per node: acked values missing from that node's own committed log."""
    out = {}
    for node, dump in sorted(obs.replicas.items()):
        have = {v for entries in dump.values() for _, v in entries}
        out[node] = _finding([_send_record(s) for s in obs.ok() if s.value not in have])
    return out


def check_replica_identity(obs: Observed) -> Finding:
    """Every replica and the leader drain hold the same offset -> value map per queue up to the
    shortest one (a missing offset counts as None), and all end at the same offset."""
    sources: dict[str, Dump] = {**obs.replicas, DRAIN: obs.drain}
    queues = sorted({q for dump in sources.values() for q in dump})
    items: list[dict[str, Any]] = []
    for q in queues:
        maps = {src: dict(dump.get(q, [])) for src, dump in sorted(sources.items())}
        ends = {src: max(m, default=-1) + 1 for src, m in maps.items()}
        min_end = min(ends.values())
        for o in sorted({o for m in maps.values() for o in m if o < min_end}):
            seen = {src: m.get(o) for src, m in maps.items()}
            if len(set(seen.values())) > 1:
                items.append({"kind": "value", "queue": q, "offset": o, "values": seen})
        if len(set(ends.values())) > 1:
            items.append({"kind": "length", "queue": q, "ends": ends})
    return _finding(items)


def check_inconsistent_offsets(obs: Observed) -> Finding:
    """(queue, offset) positions seen holding two or more values across acks, polls and dumps."""
    at: dict[tuple[int, int], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for src, q, o, v in obs.acks + obs.reads:
        at[(q, o)][v].add(src)
    items = [{"queue": q, "offset": o, "values": {v: sorted(srcs)[:5] for v, srcs in sorted(vs.items())}}
             for (q, o), vs in sorted(at.items()) if len(vs) > 1]
    return _finding(items)


def check_duplicates(obs: Observed, message_ids: dict[tuple[int, int], str] | None = None,
                     resending: frozenset[str] = frozenset()) -> tuple[Finding, Finding]:
    """Values at more than one (queue, offset) anywhere (one replica, the drain, acks vs reads):
    (protocol duplicates, retry duplicates). Retry duplicates are values whose send was ``info``,
    or, for a proc whose client resends on its own under a new message id (``resending``: the
    C++ client), values each of whose copies the leader holds, under an id of its own
    (``message_ids``, by (queue, offset)): two messages to the broker. The harness never
    resends, so any other duplicate (one id stored twice, a copy the leader does not hold) is
    the protocol's fault."""
    where: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for _, q, o, v in obs.acks + obs.reads:
        where[v].add((q, o))
    ids = message_ids or {}
    held = {(q, o): v for q, entries in obs.drain.items() for o, v in entries}  # the leader's
    protocol: list[dict[str, Any]] = []
    retry: list[dict[str, Any]] = []
    for v, spots in sorted(where.items()):
        if len(spots) > 1:
            item = {"value": v, "positions": sorted(spots), "outcome": obs.outcome(v)}
            send = obs.sends.get(v)
            copies = [ids.get(spot) if held.get(spot) == v else None for spot in spots]
            resent = (send is not None and send.proc in resending and None not in copies
                      and len(set(copies)) == len(copies))
            if resent:
                item["message_ids"] = sorted(str(c) for c in copies)
            (retry if item["outcome"] == "info" or resent else protocol).append(item)
    return _finding(protocol), _finding(retry)


def check_unexpected(obs: Observed) -> Finding:
    """Values read that were never sent (phantoms)."""
    return _finding(sorted(v for v in obs.read_values() if v not in obs.sends))


def check_failed_but_read(obs: Observed) -> Finding:
    """Values read whose send definitely failed."""
    return _finding(sorted(v for v in obs.read_values() if obs.outcome(v) == "fail"))


def check_recovered(obs: Observed) -> Finding:
    """Indeterminate sends that took effect (informational)."""
    return _finding(sorted(v for v in obs.read_values() if obs.outcome(v) == "info"))


def check_producer_fifo(obs: Observed) -> Finding:
    """Per producer and queue, an earlier-invoked acked send has the smaller offset."""
    runs: dict[tuple[str, int], list[Send]] = defaultdict(list)
    for s in obs.ok():
        if s.queue is not None:
            runs[(s.proc, s.queue)].append(s)
    items = [{"proc": proc, "queue": q, "earlier": [a.value, a.offset], "later": [b.value, b.offset]}
             for (proc, q), sends in sorted(runs.items())
             for a, b in itertools.pairwise(sends) if (a.offset or 0) >= (b.offset or 0)]
    return _finding(items)


def check_realtime_order(obs: Observed) -> Finding:
    """Sends to one queue: if s1 was acked strictly before s2 was invoked, offset(s1) < offset(s2).
    One sweep in time order; at equal times invokes go first, so only a strict "before" counts."""
    events: list[tuple[float, int, Send]] = []
    for s in obs.ok():
        if s.t_invoke is not None and s.t_done is not None and s.queue is not None:
            events += [(s.t_invoke, 0, s), (s.t_done, 1, s)]
    events.sort(key=lambda e: (e[0], e[1]))
    top: dict[int, Send] = {}  # per queue: the acked send with the highest offset so far
    items = []
    for _, kind, s in events:
        q, off = s.queue or 0, s.offset or 0  # set on every acked send
        best = top.get(q)
        if kind == 1:
            if best is None or off > (best.offset or 0):
                top[q] = s
        elif best is not None and (best.offset or 0) >= off:
            items.append({"queue": q, "value": s.value, "offset": s.offset, "invoked": s.t_invoke,
                          "acked_before": [best.value, best.offset, best.t_done]})
    return _finding(items)


def check_consumer_order(obs: Observed) -> Finding:
    """Within one (consumer, session) each poll starts where the previous one ended (else
    ``poll-skip`` forward / ``nonmonotonic-poll`` backward) and returns contiguous offsets."""
    expect: dict[tuple[str, int], int] = {}
    items: list[dict[str, Any]] = []

    def report(kind: str, ev: dict[str, Any], got: int, want: int) -> None:
        items.append({"kind": kind, "proc": ev["proc"], "session": ev.get("session", 0),
                      "queue": ev.get("queue"), "from": ev["from"], "offset": got, "expected": want,
                      "t": ev.get("t")})

    for ev in obs.polls:
        key, start = (str(ev["proc"]), int(ev.get("session", 0))), int(ev["from"])
        want = expect.get(key, start)
        if start != want:
            report("poll-skip" if start > want else "nonmonotonic-poll", ev, start, want)
        offsets = [int(o) for o, _ in ev.get("values") or []] if ev["type"] == "ok" else []
        for i, o in enumerate(offsets):
            if o != start + i:
                report("poll-skip" if o > start + i else "nonmonotonic-poll", ev, o, start + i)
                break
        expect[key] = offsets[-1] + 1 if offsets else start
    kinds = {k: sum(1 for it in items if it["kind"] == k) for k in ("poll-skip", "nonmonotonic-poll")}
    return _finding(items, **kinds)


@dataclass(frozen=True)
class CheckResult:
    """Every check's finding, the leadership and availability measurements, and the verdict."""

    lost: Finding
    lost_on_replica: dict[str, Finding]
    replica_divergence: Finding
    inconsistent_offsets: Finding
    duplicates: Finding
    retry_duplicates: Finding
    unexpected: Finding
    failed_but_read: Finding
    recovered: Finding
    producer_fifo: Finding
    realtime_order: Finding
    consumer_order: Finding
    stale_reads: Finding  # consumer offsets read back through the leader (chaos.live.checkers.registers)
    phantom_offsets: Finding
    trace_problems: list[str]
    leadership: dict[str, Any]
    availability: dict[str, Any]
    violations: list[str]
    failed_checks: list[str]

    @property
    def verdict(self) -> str:
        return "FAIL" if self.violations else "PASS"

    @property
    def lost_on_replica_max(self) -> int:
        return max((f.count for f in self.lost_on_replica.values()), default=0)

    def to_dict(self) -> dict[str, Any]:
        """Flat counts (as chaos.live.report.writer reads them), then examples and details, JSON-ready."""
        named = _named_findings(self)
        counts = {name: f.count for name, f in named.items()}
        return _jsonable_dict({
            "verdict": self.verdict, "violations": self.violations, "failed_checks": self.failed_checks,
            **{k: self.availability[k] for k in ("attempted", "ok", "fail", "info", "pending")},
            **counts,
            "lost_on_replica": {n: f.count for n, f in self.lost_on_replica.items()},
            "lost_on_replica_max": self.lost_on_replica_max,
            "trace_problems": self.trace_problems, **self.leadership,
            **{k: v for k, v in self.availability.items() if k not in counts},
            "examples": {name: f.examples for name, f in named.items() if f.examples}
            | {f"lost_on_replica {n}": f.examples for n, f in self.lost_on_replica.items() if f.examples},
            "details": {name: f.detail for name, f in named.items() if f.detail},
        })


def _named_findings(r: CheckResult) -> dict[str, Finding]:
    return {"lost": r.lost, "replica_divergences": r.replica_divergence,
            "inconsistent_offsets": r.inconsistent_offsets, "duplicates_protocol": r.duplicates,
            "duplicates_retry": r.retry_duplicates, "unexpected": r.unexpected,
            "failed_but_read": r.failed_but_read, "recovered": r.recovered,
            "order_producer": r.producer_fifo, "order_realtime": r.realtime_order,
            "order_consumer": r.consumer_order, "stale_reads": r.stale_reads,
            "phantom_offsets": r.phantom_offsets}


def _jsonable_dict(d: dict[Any, Any]) -> dict[str, Any]:
    return {str(k): _jsonable(v) for k, v in d.items()}


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return _jsonable_dict(x)
    if isinstance(x, (set, frozenset)):
        return [_jsonable(v) for v in sorted(x, key=repr)]
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


# name in failed_checks -> what a violation line says
SAFETY = {"lost": "acknowledged values never read",
          "replica_divergences": "replica divergences (split brain)",
          "inconsistent_offsets": "offsets holding two or more values",
          "duplicates_protocol": "values stored at more than one offset",
          "unexpected": "values read that were never sent",
          "failed_but_read": "values read although their send failed",
          "order_producer": "producer FIFO violations",
          "order_realtime": "real-time order violations",
          "order_consumer": "consumer poll order violations",
          "stale_reads": "offset reads older than a commit acknowledged before them",
          "phantom_offsets": "offset reads of a value never committed"}


def check_run(history: list[dict[str, Any]], replicas: dict[str, Dump], leader_drain: Dump,
              trace_events: list[dict[str, Any]], *, max_leader_changes: int | None = None,
              allow_loss: bool = False, silence: SilenceBound | None = None,
              message_ids: dict[tuple[int, int], str] | None = None,
              resending: frozenset[str] = frozenset()) -> CheckResult:
    """All checks over one run. ``allow_loss`` reports lost / lost_on_replica without failing (runs
    whose durability mode may lose acked data); ``max_leader_changes`` bounds leader churn;
    ``silence`` bounds the producers' availability under a leader's one-way silence;
    ``message_ids`` and ``resending``: ``check_duplicates``."""
    avail = availability(history)
    silence_lines: list[str] = []
    if silence is not None:
        avail["silence"], silence_lines = check_silence(history, silence)
    obs = observe(history, replicas, leader_drain)
    protocol, retry = check_duplicates(obs, message_ids, resending)
    stale, phantom = check_offset_reads(history)
    result = CheckResult(
        lost=check_lost(obs), lost_on_replica=check_lost_on_replica(obs),
        replica_divergence=check_replica_identity(obs), inconsistent_offsets=check_inconsistent_offsets(obs),
        duplicates=protocol, retry_duplicates=retry, unexpected=check_unexpected(obs),
        failed_but_read=check_failed_but_read(obs), recovered=check_recovered(obs),
        producer_fifo=check_producer_fifo(obs), realtime_order=check_realtime_order(obs),
        consumer_order=check_consumer_order(obs), stale_reads=_finding(stale),
        phantom_offsets=_finding(phantom), trace_problems=traces.check(trace_events),
        leadership=leadership(trace_events), availability=avail,
        violations=[], failed_checks=[])
    failed, violations = _violations(result, max_leader_changes, allow_loss)
    if silence_lines:
        failed.append("silence_availability")
    return replace(result, failed_checks=failed, violations=violations + silence_lines)


def _violations(r: CheckResult, max_leader_changes: int | None,
                allow_loss: bool) -> tuple[list[str], list[str]]:
    failed: list[str] = []
    lines: list[str] = []
    named = _named_findings(r)
    for name, what in SAFETY.items():
        f = named[name]
        if f.count and not (allow_loss and name == "lost"):
            failed.append(name)
            lines.append(f"{name}: {f.count} {what}, e.g. {_jsonable(f.examples[:3])}")
    short = {n: f.count for n, f in r.lost_on_replica.items() if f.count}
    if short and not allow_loss:
        failed.append("lost_on_replica")
        lines.append(f"lost_on_replica: acknowledged values missing from replicas {short} "
                     f"(max {r.lost_on_replica_max})")
    if r.trace_problems:
        failed.append("raft_traces")
        lines.append(f"raft_traces: {len(r.trace_problems)} problems, e.g. {r.trace_problems[:3]}")
    changes = r.leadership["leader_changes"]
    if max_leader_changes is not None and changes > max_leader_changes:
        failed.append("leader_churn")
        lines.append(f"leader churn: {changes} leader changes > bound {max_leader_changes}")
    return failed, lines
