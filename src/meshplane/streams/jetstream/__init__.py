"""The streams service on NATS JetStream: topics as replicated streams, groups in a key-value bucket
(``service.JetStreamStreamsService``).

Several ``meshplane serve --storage nats://...`` processes share one JetStream cluster: any of them
serves any topic and group, and any of them can die.
"""
