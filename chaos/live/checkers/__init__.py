"""The verdicts of a live chaos run, decided offline from what it recorded: the safety checkers
(``safety``: no acknowledged write lost, one leader per term, committed logs that agree, ...),
register-like histories (``registers``), liveness figures (``availability``) and one checker per
messaging feature (``delay``, ``orderly``, ``retry``, ``txn``, ``pop``, ``acl``, ``batch``)."""

__all__: list[str] = []
