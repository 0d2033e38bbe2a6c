"""The broker's front ends: adapters from a client protocol to the broker API."""

__all__: list[str] = []
