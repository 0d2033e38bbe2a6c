"""Delayed and timed messages: the delay levels and pending timers (``model``), and the
leader's delivery of due timers (``service``)."""

__all__: list[str] = []
