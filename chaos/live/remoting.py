"""RocketMQ 4.x producers in a live chaos run (a scenario with ``remoting``): each a C++ client
(``chaos.live.remoting_producer``, in the clients' environment of ``make clients``) sending to
the brokers' remoting endpoints, its events recorded in the run's history as the workload's
producers' are (``send`` invoke -> ok | info, stamped with the client's own clock), so the
offline checker judges them the same way: no acknowledged send lost, none stored twice. A send
the C++ client gave up on is ``info`` (its outcome unknown: the client may have timed out on a
stored message). The ok events carry no queue (the wrapper does not say which), so the order
checks, which need one, leave them out.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from chaos.live.workload import History

__all__ = ["CPP_PYTHON", "RemotingProducers"]

CPP_PYTHON = Path(__file__).resolve().parents[2] / ".venv-clients" / "rmq4" / "bin" / "python"
DRIVER = Path(__file__).with_name("remoting_producer.py")
READY_S = 30.0
STOP_S = 10.0


class RemotingProducers:
    """``count`` C++ producers (procs ``r0``, ``r1`` ...) recording into ``history``."""

    def __init__(self, history: History, namesrv: str, topic: str, count: int, pause_s: float,
                 seed: int, home: str) -> None:
        self.history, self.namesrv, self.topic = history, namesrv, topic
        self.count, self.pause_s, self.seed, self.home = count, pause_s, seed, home
        self.procs: list[asyncio.subprocess.Process] = []
        self.readers: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        if not CPP_PYTHON.exists():
            raise RuntimeError(f"{CPP_PYTHON} is missing: run `make clients`")
        os.makedirs(self.home, exist_ok=True)
        env = {**os.environ, "HOME": self.home, "PYTHONPATH": ""}  # (its logs under HOME)
        for k in range(self.count):
            proc = await asyncio.create_subprocess_exec(
                str(CPP_PYTHON), str(DRIVER), self.namesrv, self.topic, f"r{k}",
                str(self.pause_s), str(self.seed + k), stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL, env=env, cwd=self.home)
            self.procs.append(proc)
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), READY_S)
            if not line:
                raise RuntimeError("a 4.x producer ended before it was ready")
            self.readers.append(asyncio.create_task(self._record(proc, f"r{k}")))

    async def _record(self, proc: asyncio.subprocess.Process, name: str) -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            try:
                ev: dict[str, Any] = json.loads(line)
            except ValueError:  # not one of its events (the client library printed something)
                continue
            if ev.get("type") in ("invoke", "ok", "info"):
                self.history.add_at(float(ev.pop("t")), proc=name, f="send", **ev)

    async def stop(self) -> None:
        """SIGTERM to each (it ends after its send under way), then its last lines read; a
        second call does nothing."""
        procs, self.procs = self.procs, []
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), STOP_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await asyncio.gather(*self.readers, return_exceptions=True)
        if any(p.returncode not in (0, -signal.SIGTERM) for p in procs):
            sys.stderr.write(f"4.x producers ended with {[p.returncode for p in procs]}\n")
