"""Doors: foreign protocols (NATS, MQTT) on a mesh node."""
