"""RocketMQ 5 clients through the gRPC front end."""
