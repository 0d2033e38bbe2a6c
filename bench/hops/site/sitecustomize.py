"""Loaded by every Python process started with this folder on ``PYTHONPATH`` (``bench.hops``
puts it there for the servers it starts): with ``DLEDGER_HOPS_DIR`` set, the process's frames
are stamped (``bench.hops.record``)."""

import os

if os.environ.get("DLEDGER_HOPS_DIR"):
    from bench.hops.record import install

    install(os.environ["DLEDGER_HOPS_DIR"])
