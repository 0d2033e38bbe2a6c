"""dledger: a Raft-replicated log (the commitlog of a DLedger-style broker group)."""
