"""``dledger consumer ...`` (the command group itself is in ``cli.admin``) and ``dledger dlq
...``: a consumer group's status and offsets, the questions asked of a running consumer, its
retry policy, and its retry and dead-letter queues."""
