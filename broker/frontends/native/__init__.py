"""Our own client protocol's front end: the client port's listener and connections (``server``),
an adapter from frames to the broker API."""

__all__: list[str] = []
