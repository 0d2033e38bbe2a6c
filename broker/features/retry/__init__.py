"""Retry and dead letters: what a consumer's send-back puts where (``model``) and the
leader's send-back and dead-letter resend (``service``)."""

__all__: list[str] = []
