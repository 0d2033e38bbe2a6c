"""The messaging features: delay, orderly, pop, retry and dead letters, transactions, trace, access
control, exactly-once pipelines."""
