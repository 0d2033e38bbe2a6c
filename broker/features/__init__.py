"""The broker's features, each in its folder: its pure part (``model``), its log entries and
their apply, its leader-only service and its request handlers."""

__all__: list[str] = []
