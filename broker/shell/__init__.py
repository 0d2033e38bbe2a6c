"""A broker node's operational shell: checkpoints and snapshots of the state machine, the
admin HTTP endpoints, Prometheus metrics, and registration with the NameServers."""

__all__: list[str] = []
