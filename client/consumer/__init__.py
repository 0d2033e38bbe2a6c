"""Consuming: the pull consumer (``pull``), the push consumer (``push``) and its orderly form
(``orderly``), the lite pull consumer (``lite``, with ``lite_buffer``), consumer-group membership
and heartbeats (``membership``), rebalancing (``rebalance``) and a broadcasting consumer's local
offsets (``offset_store``)."""

__all__: list[str] = []
