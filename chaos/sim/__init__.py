"""The deterministic simulator: many Raft cores in one process, one seed drives every fault."""

from chaos.sim.node import Violation
from chaos.sim.observer import Observer
from chaos.sim.runner import CANARIES, SeedResult, SweepSummary, run_seed, sweep
from chaos.sim.world import FaultSettings, World

__all__ = ["CANARIES", "FaultSettings", "Observer", "SeedResult", "SweepSummary", "Violation",
           "World", "run_seed", "sweep"]
