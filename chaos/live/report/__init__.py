"""The report of live chaos runs: Markdown and JSON (``writer``), its tables (``tables``,
``cells``) and the timeline of faults and leadership (``timeline``)."""

__all__: list[str] = []
