"""The NameServer process of ``dledger up``: started with its stderr appended to
``DATA_DIR/namesrv.log``, its address read from its ready line, its failure told from what this
start wrote to that log (a busy port's bind error, not "see namesrv.log")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import click

STOP_TIMEOUT_S = 10.0


@dataclass
class NameSrvProcess:
    proc: subprocess.Popen[str]
    address: str
    log_path: str
    log_start: int  # where this start's output begins in the appended log

    @classmethod
    def start(cls, port: int, data_dir: str, extra_args: tuple[str, ...] = ()) -> NameSrvProcess:
        log_path = os.path.join(data_dir, "namesrv.log")
        with open(log_path, "ab") as log:
            log_start = log.tell()
            proc = subprocess.Popen([sys.executable, "-m", "namesrv", "--listen", f"127.0.0.1:{port}",
                                     *extra_args],
                                    stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                    text=True, start_new_session=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the ready line; EOF (an empty line) if it exited
        if not line:
            proc.wait(timeout=STOP_TIMEOUT_S)
            started = cls(proc, "", log_path, log_start)
            raise click.ClickException(f"the NameServer did not start{started.last_words()}")
        host, p = json.loads(line)["listen"]
        return cls(proc, f"{host}:{p}", log_path, log_start)

    def last_words(self) -> str:
        """``": <last line this start logged> (log: PATH)"``, or the path alone."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_start)
                lines = f.read().decode("utf-8", errors="replace").strip().splitlines()
        except OSError:
            lines = []
        if not lines:
            return f" (log: {self.log_path})"
        last = lines[-1].removeprefix("Error: ")  # click's prefix: ours is coming
        return f": {last} (log: {self.log_path})"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
