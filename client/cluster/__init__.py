"""The cluster as the client sees it: routes from the NameServers and one connection pool per
group (``routes``), message query (``query``) and the admin views behind ``dledger status`` and
``dledger consumer`` (``admin_views``)."""

__all__: list[str] = []
