"""Membership changes in a node: the shell around ``dledger.raft.membership`` (``shell``): add a
learner, promote it, remove a member, one change at a time through the log."""

__all__: list[str] = []
