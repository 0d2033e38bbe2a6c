"""The remoting endpoint for RocketMQ 4.x clients (``server``): its sends (``sends``), its consuming
requests (``consume``) and its header fields and refusals (``fields``)."""
