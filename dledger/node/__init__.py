"""One member of a replicated-log group: ``runtime.Node``, made of parts that each own one
concern (``base``: the shared fields; ``seams``: the stores and transport it runs on, given or
its own; ``proposals``; ``ready_pipeline``: persist, send, apply; ``busy_poll``;
``disk_full``), its configuration and the values its API hands out (``config``), what it
counts (``stats``), its event trace (``trace``) and giving heap memory back (``heap``)."""

__all__: list[str] = []
