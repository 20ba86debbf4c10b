"""What a web page the operator visits can make this server do: nothing.

A page on another site may send "simple" requests to ``http://127.0.0.1:PORT`` (a form's POST with a
``text/plain`` body needs no preflight) and open WebSockets to it; its browser then says where it
came from in ``Origin``, which must be this server. A page whose name an attacker points at 127.0.0.1
(DNS rebinding) is "same-origin" to the browser, so a server listening on loopback also answers only
requests addressed to a loopback name in ``Host``. Programs (the CLI, SDKs, Spark) send no ``Origin``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _hostname(host: str) -> str:
    """``host[:port]`` or ``[v6]:port`` without the port, lower-cased."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback_name(host: str) -> bool:
    name = _hostname(host)
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def refusal(method: str, headers: Mapping[str, str], loopback_only: bool) -> str | None:
    """Why a request must be refused (None: it may go on)."""
    host = headers.get("Host", "")
    if loopback_only and host and not is_loopback_name(host):  # browsers always send Host
        return f"this server answers requests for a loopback name only, not Host {host[:100]!r}"
    origin = headers.get("Origin")
    changes = method not in SAFE_METHODS or headers.get("Upgrade", "").lower() == "websocket"
    if origin is None or not changes:
        return None
    if origin == "null" or urlsplit(origin).netloc.lower() != host.strip().lower():
        return f"a request from another site's page ({origin[:100]}) is refused"
    return None
