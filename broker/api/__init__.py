"""The in-process broker API that every front end calls: sends (checked, grouped per event-loop
turn into one entry, answered once applied), pulls, and the rest of what a client may ask."""

__all__: list[str] = []
