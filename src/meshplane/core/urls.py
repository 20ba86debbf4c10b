"""URLs in what meshplane says: never with their credentials."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redact_url(url: str) -> str:
    """The URL (or comma-separated URLs) without credentials, for messages and logs."""
    if "," in url:
        return ",".join(redact_url(one.strip()) for one in url.split(","))
    parts = urlsplit(url)
    if parts.username or parts.password:
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        return urlunsplit(parts._replace(netloc=f"***@{netloc}"))
    return url
