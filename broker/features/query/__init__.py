"""Message query: the key index on disk (``index``, ``index_file``), turning a hit into a
stored message (``lookup``) and the query requests (``handlers``)."""

__all__: list[str] = []
