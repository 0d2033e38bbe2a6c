"""What a checkpoint costs the event loop in consume-queue work, by queue count:
``python -m bench.storage.cq_checkpoint --queues 2048 [--units 200] [--rounds 3]`` (a tool, not a test).

Builds ``broker.core.cq_files.FileQueues`` under a temp dir with Q queues, then, each round,
appends ``--units`` units to every queue (what a busy topic set stores between two checkpoints)
and times the parts a broker checkpoint runs: ``sync_job()`` (on the loop: every queue's units
not yet written, copied), the job it returns (in a thread: those units written, each file
fsynced), then its ``written()`` (on the loop: the units leave memory) and ``trim`` of every
queue (on the loop: retention's look for whole files to delete). Round 0
creates the files; later rounds write into them.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from broker.core.cq_files import FileConsumeQueue, FileQueues


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=2048)
    parser.add_argument("--units", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        store = FileQueues(os.path.join(d, "cq"))
        queues = [store.create(no) for no in range(args.queues)]
        files = [q for q in queues if isinstance(q, FileConsumeQueue)]
        print(f"{args.queues} queues, {args.units} units each a round, {store.fds_max} files "
              "kept open")
        position = 0
        for r in range(args.rounds):
            for _ in range(args.units):
                for q in queues:
                    q.append(position, 0, 100, 0, 0)
                    position += 1
            t0 = time.perf_counter()
            job = store.sync_job()
            t1 = time.perf_counter()
            job()
            t2 = time.perf_counter()
            job.written()
            for f in files:
                f.trim(0)
            t3 = time.perf_counter()
            print(f"round {r}: on the loop: copy {1000 * (t1 - t0):.1f} ms, written and trim "
                  f"{1000 * (t3 - t2):.1f} ms; in a thread: write and fsync "
                  f"{1000 * (t2 - t1):.1f} ms")
        store.close()


if __name__ == "__main__":
    main()
