"""RocketMQ 4.x producers in a live chaos run (a scenario with ``remoting``): each a C++ client
(``chaos.live.remoting_producer``, in the clients' environment of ``make clients``) sending to
the brokers' remoting endpoints, its events recorded in the run's history as the workload's
producers' are (``send`` invoke -> ok | info, stamped with the client's own clock), so the
offline checker judges them the same way: no acknowledged send lost, none stored twice. A send
the C++ client gave up on is ``info`` (its outcome unknown: the client may have timed out on a
stored message). The ok events carry no queue (the wrapper does not say which), so the order
checks, which need one, leave them out.

With ``orderly``, a 4.x orderly pipeline runs beside them on a topic of its own
(``chaos.live.remoting_orderly``): a C++ orderly producer (order ids ``x0``..., each message
sent until acknowledged before the id's next) and two C++ orderly push consumer members of one
group. Their listener calls are judged by the orderly checker (``chaos.live.checkers.orderly``:
no two members in one queue at once, each order id's messages first processed in order, none
acknowledged and never processed) once the consumers have caught up (``ORDERLY_DRAIN_S`` at most).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from chaos.live.checkers.orderly import Processing, check_orderly
from chaos.live.workload import History

__all__ = ["CPP_PYTHON", "ORDERLY_GROUP", "ORDERLY_TOPIC", "RemotingProducers"]

CPP_PYTHON = Path(__file__).resolve().parents[2] / ".venv-clients" / "rmq4" / "bin" / "python"
DRIVER = Path(__file__).with_name("remoting_producer.py")
ORDERLY_DRIVER = Path(__file__).with_name("remoting_orderly.py")
READY_S = 30.0
STOP_S = 10.0
ORDERLY_TOPIC, ORDERLY_GROUP = "chaos-4x-orderly", "chaos-4x-orderly-g"
ORDER_IDS = 8
ORDERLY_PAUSE_S = 0.05  # between the producer's rounds over its order ids
ORDERLY_DRAIN_S = 30.0  # the consumers' catching up after the producers stop, at most


class RemotingProducers:
    """``count`` C++ producers (procs ``r0``, ``r1`` ...) recording into ``history``; with
    ``orderly``, the orderly pipeline (producer ``ro``, members ``rc0`` and ``rc1``) too."""

    def __init__(self, history: History, namesrv: str, topic: str, count: int, pause_s: float,
                 seed: int, home: str, orderly: bool = False) -> None:
        self.history, self.namesrv, self.topic = history, namesrv, topic
        self.count, self.pause_s, self.seed, self.home = count, pause_s, seed, home
        self.orderly = orderly
        self.procs: list[asyncio.subprocess.Process] = []  # producers
        self.members: list[asyncio.subprocess.Process] = []  # orderly consumers
        self.readers: list[asyncio.Task[None]] = []
        self.processing: list[Processing] = []
        self.acked: dict[str, int] = {}  # order id -> messages acknowledged (seqs 0..n-1)
        self.orderly_unknown = 0  # orderly sends the client raised on (sent again)
        self.orderly_drained = False  # the consumers caught up before they were stopped

    def procs_resending(self) -> list[str]:
        """The procs whose client sends a message again on its own, under a new id: the C++
        client (rocketmq-client-cpp's ``sendKernelImpl`` gives every attempt a fresh
        ``UNIQ_KEY``, and its default two retries cannot be turned off through its C API), so
        that an attempt stored but unanswered and its retry are two messages to the broker."""
        return [f"r{k}" for k in range(self.count)]

    async def start(self) -> None:
        if not CPP_PYTHON.exists():
            raise RuntimeError(f"{CPP_PYTHON} is missing: run `make clients`")
        os.makedirs(self.home, exist_ok=True)
        for k in range(self.count):
            self.procs.append(await self._spawn(f"r{k}", DRIVER, self.namesrv, self.topic,
                                                f"r{k}", str(self.pause_s), str(self.seed + k)))
        if self.orderly:
            for member in ("rc0", "rc1"):
                self.members.append(await self._spawn(member, ORDERLY_DRIVER, "consume",
                                                      self.namesrv, ORDERLY_TOPIC,
                                                      ORDERLY_GROUP, member))
            self.procs.append(await self._spawn("ro", ORDERLY_DRIVER, "produce", self.namesrv,
                                                ORDERLY_TOPIC, "chaos-4x-orderly-p",
                                                str(ORDER_IDS), str(ORDERLY_PAUSE_S)))

    async def _spawn(self, name: str, driver: Path, *args: str) -> asyncio.subprocess.Process:
        env = {**os.environ, "HOME": self.home, "PYTHONPATH": ""}  # (its logs under HOME)
        proc = await asyncio.create_subprocess_exec(
            str(CPP_PYTHON), str(driver), *args, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, env=env, cwd=self.home)
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), READY_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        if not line:
            raise RuntimeError(f"4.x client {name} ended before it was ready")
        self.readers.append(asyncio.create_task(self._record(proc, name)))
        return proc

    async def _record(self, proc: asyncio.subprocess.Process, name: str) -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            try:
                ev: dict[str, Any] = json.loads(line)
            except ValueError:  # not one of its events (the client library printed something)
                continue
            kind = ev.get("type")
            if name == "ro":
                if kind == "acked":
                    self.acked[str(ev["order"])] = int(ev["seq"]) + 1
                elif kind == "info":
                    self.orderly_unknown += 1
            elif kind == "proc":
                self.processing.append(Processing(
                    str(ev["member"]), f"{ORDERLY_TOPIC}/{ev['queue']}", int(ev["offset"]),
                    str(ev["order"]), int(ev["seq"]), int(ev["start_ns"]), int(ev["end_ns"]),
                    True))
            elif kind in ("invoke", "ok", "info"):
                self.history.add_at(float(ev.pop("t")), proc=name, f="send", **ev)

    async def stop(self) -> None:
        """SIGTERM to each producer (it ends after its send under way), the orderly consumers
        given time to catch up, then SIGTERM to them and their last lines read; a second call
        does nothing."""
        await self._end(self.procs)
        self.procs = []
        if self.members:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + ORDERLY_DRAIN_S
            while not self._caught_up() and loop.time() < deadline:
                await asyncio.sleep(0.2)  # (polling what the consumers printed: bounded)
            self.orderly_drained = self._caught_up()
            members, self.members = self.members, []
            await self._end(members)
        await asyncio.gather(*self.readers, return_exceptions=True)

    def _caught_up(self) -> bool:
        done = {(p.order_id, p.seq) for p in self.processing}
        return all((oid, seq) in done for oid, n in self.acked.items() for seq in range(n))

    def orderly_violations(self) -> list[str]:
        """The orderly checker's findings about the 4.x orderly pipeline."""
        return [f"4.x orderly: {v}" for v in check_orderly(self.processing, self.acked)]

    async def _end(self, procs: list[asyncio.subprocess.Process]) -> None:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), STOP_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if any(p.returncode not in (0, -signal.SIGTERM) for p in procs):
            sys.stderr.write(f"4.x clients ended with {[p.returncode for p in procs]}\n")
