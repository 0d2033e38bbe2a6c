"""``python -m bench.hops``: where one producer's lone send spends its time, hop by hop, on a
real 3-node group (``bench.hops.record`` stamps every process's frames; ``bench.hops.timeline``
turns the stamps into steps). A tool for finding what to change, not a test."""
