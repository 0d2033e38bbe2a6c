"""Message trace: the records of sends and consume attempts and their message form
(``records``), and the background writer that sends them to the trace topic (``tracer``)."""

__all__: list[str] = []
