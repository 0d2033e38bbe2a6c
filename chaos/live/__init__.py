"""The live chaos harness (docs/testing.md): real broker processes, every peer link through its
own fault proxy, process and disk faults, a recorded client history, offline checkers, a report."""
