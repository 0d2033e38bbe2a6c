"""The broker's state machine assembled: the core and every feature's part of the state, their log
entry kinds in one registry (``kinds``), and checkpoints that keep each feature's state under its
name (``state``; older checkpoint versions are read by ``legacy``)."""

__all__: list[str] = []
