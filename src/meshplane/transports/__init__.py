"""Transports: NATS core and ZeroMQ, each a publisher and a subscriber class with the same shape."""
