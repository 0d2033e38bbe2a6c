"""Small synthetic histories for the live chaos checkers' tests (``Run``: sends, polls, offsets,
replica dumps and trace events on a made-up timeline): a clean one, one seeded anomaly per
check, and which checks fired on one."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from chaos.live.checkers import safety as checker
from chaos.live.checkers.safety import check_run

T0 = 1_000.0


LAT = 0.01  # every ack comes 10 ms after its invoke


STEP = 0.1  # one operation every 100 ms


NODES = ("n1", "n2", "n3")


def ns(t: float) -> int:
    return round(t * 1e9)


@dataclass
class Run:
    """A tiny broker model: records the history and derives polls, replica dumps, drain and traces."""

    history: list[dict[str, Any]] = field(default_factory=list)
    queues: dict[int, list[str]] = field(default_factory=lambda: {0: [], 1: []})
    seq: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    t: float = T0
    leader: str = "n1"
    replicas: dict[str, dict[int, list[tuple[int, str]]]] = field(default_factory=dict)
    drain: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    traces: list[dict[str, Any]] = field(default_factory=list)

    def send(self, proc: str, queue: int, outcome: str = "ok", *, store: bool | None = None,
             offset: int | None = None, at: float | None = None) -> str:
        t = self.t if at is None else at
        value = f"{proc}-{self.seq[proc]}"
        self.seq[proc] += 1
        self.history.append({"proc": proc, "type": "invoke", "f": "send", "value": value, "t": t})
        pos = len(self.queues[queue]) if offset is None else offset
        if outcome == "ok" if store is None else store:
            self.queues[queue].append(value)
        done: dict[str, Any] = {"proc": proc, "type": outcome, "f": "send", "value": value, "t": t + LAT}
        if outcome == "ok":
            done.update(queue=queue, offset=pos, node=self.leader)
        else:
            done["error"] = "timeout" if outcome == "info" else "NOT_LEADER"
        self.history.append(done)
        self.t = max(self.t, t) + STEP
        return value

    def nemesis(self, f: str, fault: str | None = None, nodes: tuple[str, ...] = ()) -> None:
        ev: dict[str, Any] = {"proc": "nemesis", "type": "info", "f": f, "t": self.t}
        if fault is not None:
            ev.update(fault=fault, nodes=list(nodes))
        self.history.append(ev)
        self.t += STEP

    def poll(self, proc: str, queue: int, session: int, start: int, n: int | None = None,
             ok: bool = True) -> None:
        ev: dict[str, Any] = {"proc": proc, "type": "ok" if ok else "fail", "f": "poll", "queue": queue,
                              "from": start, "session": session, "t": self.t}
        if ok:
            vals = self.queues[queue][start:] if n is None else self.queues[queue][start:start + n]
            ev.update(values=[[start + i, v] for i, v in enumerate(vals)], node=self.leader)
        else:
            ev["error"] = "timeout"
        self.history.append(ev)
        self.t += STEP

    def finish(self) -> Run:
        for q in self.queues:  # consumer c<q>: tail-follow in pairs, a failed poll, then a re-read
            start = 0
            while start < len(self.queues[q]):
                self.poll(f"c{q}", q, 0, start, 2)
                start = min(start + 2, len(self.queues[q]))
            self.poll(f"c{q}", q, 0, start, ok=False)
            self.poll(f"c{q}", q, 0, start)
            self.poll(f"c{q}", q, 1, 0)
        dump = {q: list(enumerate(vs)) for q, vs in self.queues.items()}
        self.replicas = {n: {q: list(es) for q, es in dump.items()} for n in NODES}
        self.drain = {q: list(es) for q, es in dump.items()}
        ev = [{"node": n, "t": ns(T0 - 1), "ev": "start"} for n in NODES]
        ev += [{"node": n, "t": ns(T0 - 0.5), "ev": "role", "term": 1,
                "role": "leader" if n == "n1" else "follower"} for n in NODES]
        ev += [{"node": n, "t": ns(T0 - 0.6), "ev": "vote", "term": 1, "voted_for": "n1"} for n in NODES]
        ev += [{"node": n, "t": ns(T0), "ev": "commit", "index": 1, "term": 1, "crc": 7} for n in NODES]
        ev += [{"node": "n2", "t": ns(T0 + 0.45), "ev": "role", "term": 2, "role": "leader"},
               {"node": "n3", "t": ns(T0 + 0.46), "ev": "role", "term": 2, "role": "follower"},
               {"node": "n1", "t": ns(T0 + 0.85), "ev": "role", "term": 2, "role": "follower"},
               {"node": "n2", "t": ns(T0 + 0.5), "ev": "commit", "index": 2, "term": 2, "crc": 9}]
        self.traces = ev
        return self

    def check(self, **kw: Any) -> checker.CheckResult:
        return check_run(self.history, self.replicas, self.drain, self.traces, **kw)

    def everywhere(self, queue: int, value: str) -> None:
        """Append ``value`` at the end of ``queue`` in every replica and the drain (not the polls)."""
        for dump in [*self.replicas.values(), self.drain]:
            dump[queue].append((len(dump[queue]), value))


def clean() -> Run:
    """p0-0 p1-0 -> q0, p0-1 p1-1 -> q1; isolate n1; p0-2 -> q0 via n2, p1-2 fails, p0-3 is info
    (not stored); stop; p1-3 -> q0; heal; p0-4 -> q1."""
    r = Run()
    r.send("p0", 0), r.send("p1", 0), r.send("p0", 1), r.send("p1", 1)
    r.nemesis("start", "isolate", ("n1",))  # T0+0.4
    r.leader = "n2"
    r.send("p0", 0), r.send("p1", 1, "fail"), r.send("p0", 1, "info")
    r.nemesis("stop", "isolate", ("n1",))  # T0+0.8
    r.send("p1", 0)
    r.nemesis("heal")  # T0+1.0
    r.send("p0", 1)  # T0+1.1
    return r


def offset_op(r: Run, f: str, value: int, kind: str = "ok", op: int = 0,
              invoke: bool = True) -> None:
    """One consumer-offset commit or read-back (group g0, queue 0) at the run's clock."""
    base = {"proc": "c0", "f": f, "group": "g0", "queue": 0, "op": op}
    if invoke:
        r.history.append({**base, "type": "invoke", "value": value, "t": r.t})
        r.t += STEP
    r.history.append({**base, "type": kind, "value": value, "t": r.t})
    r.t += STEP


def with_offsets(r: Run) -> Run:
    """Commit 2 then 5, reading back after each (and once before any commit: -1)."""
    offset_op(r, "offset-read", -1, op=0)
    offset_op(r, "offset-commit", 2, op=1)
    offset_op(r, "offset-read", 2, op=2)
    offset_op(r, "offset-commit", 5, op=3)
    offset_op(r, "offset-read", 5, op=4)
    return r


def stale_offset_read() -> Run:
    r = with_offsets(clean().finish())
    offset_op(r, "offset-read", 2, op=5)  # invoked after the commit of 5 was acknowledged
    return r


def phantom_offset_read() -> Run:
    r = with_offsets(clean().finish())
    offset_op(r, "offset-read", 9, op=5)  # nobody ever committed 9
    return r


def fired(result: checker.CheckResult) -> set[str]:
    assert (result.verdict == "FAIL") == bool(result.failed_checks) == bool(result.violations)
    return set(result.failed_checks)


def lost_with_no_replica_dumps() -> Run:
    r = clean()
    r.send("p1", 0, store=False)  # acked at q0 offset 4, stored nowhere
    r.finish()
    r.replicas = {}  # with dumps, a value read nowhere is also missing from every replica
    return r


def lost_with_dumps() -> Run:
    r = clean()
    r.send("p1", 0, store=False)
    return r.finish()


def missing_from_every_replica_but_polled() -> Run:
    r = clean().finish()
    for dump in [*r.replicas.values(), r.drain]:
        dump[0].pop()  # p1-3, which the consumers did read
    return r


def one_replica_shorter() -> Run:
    r = clean()
    r.send("p1", 1, "info", store=True)  # stored (recovered) but n3 never got it
    r.finish()
    r.replicas["n3"][1].pop()
    return r


def stale_poll_at_an_acked_offset() -> Run:
    r = clean()
    ghost = r.send("p1", 1, "info", store=False)
    r.finish()
    for ev in r.history:  # c0 reads q0 offset 1 as the ghost (a deposed leader's divergent log)
        if ev["f"] == "poll" and ev["proc"] == "c0" and ev["type"] == "ok" and ev["session"] == 0:
            ev["values"] = [[o, ghost if o == 1 else v] for o, v in ev["values"]]
    return r


def acked_value_stored_twice() -> Run:
    r = clean().finish()
    r.everywhere(0, "p0-0")
    return r


def phantom_value() -> Run:
    r = clean().finish()
    r.everywhere(1, "p9-0")
    return r


def failed_send_read() -> Run:
    r = clean().finish()
    r.everywhere(1, "p1-2")
    return r


def producer_reordered_with_equal_timestamps() -> Run:
    r = clean()
    end, t = len(r.queues[0]), r.t
    a = r.send("p0", 0, store=False, offset=end + 1, at=t)
    b = r.send("p0", 0, store=False, offset=end, at=t + LAT)  # invoked when a's ack came: not after it
    r.queues[0] += [b, a]
    return r.finish()


def later_send_of_another_producer_gets_a_smaller_offset() -> Run:
    r = clean()
    end = len(r.queues[0])
    a = r.send("p0", 0, store=False, offset=end + 1)
    b = r.send("p1", 0, store=False, offset=end)  # invoked 90 ms after a's ack
    r.queues[0] += [b, a]
    return r.finish()


def consumer_skips_ahead() -> Run:
    r = clean().finish()
    r.poll("c0", 0, 0, len(r.queues[0]) + 1)  # session 0 had reached the end; asks one past it
    return r


def two_leaders_in_term_1() -> Run:
    r = clean().finish()
    r.traces.append({"node": "n3", "t": ns(T0 + 0.2), "ev": "role", "term": 1, "role": "leader"})
    return r
