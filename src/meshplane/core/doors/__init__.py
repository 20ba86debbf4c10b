"""Doors' protocol codecs, sans I/O: NATS and MQTT."""
