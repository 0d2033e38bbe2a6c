"""Access control: accounts and permissions through the log (``model``, ``entries``), and the
check at the door of every request (``service``)."""

__all__: list[str] = []
