"""The streams service over HTTP, WebSocket and server-sent events (aiohttp): thin adapters."""
