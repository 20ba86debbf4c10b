"""What a web page can make a streams server do: a request from another site's page that changes
something, a WebSocket it opens, or a request addressed to a name rebound to 127.0.0.1 is refused;
programs (no Origin) and the dashboard's own page are served."""

from __future__ import annotations

import pytest

from meshplane.streams.http.origin import is_loopback_name, refusal


@pytest.mark.parametrize(
    ("method", "headers"),
    [
        ("POST", {"Host": "127.0.0.1:15500", "Origin": "https://evil.example"}),
        ("DELETE", {"Host": "127.0.0.1:15500", "Origin": "http://127.0.0.1:9999"}),  # another port
        ("POST", {"Host": "127.0.0.1:15500", "Origin": "null"}),  # a sandboxed frame, a file
        ("GET", {"Host": "127.0.0.1:15500", "Origin": "https://evil.example", "Upgrade": "websocket"}),
    ],
)
def test_another_sites_page_is_refused_what_changes_something(method: str, headers: dict[str, str]) -> None:
    assert refusal(method, headers, loopback_only=True) is not None


@pytest.mark.parametrize(
    ("method", "headers"),
    [
        ("POST", {"Host": "127.0.0.1:15500"}),  # a program: no Origin
        ("POST", {"Host": "127.0.0.1:15500", "Origin": "http://127.0.0.1:15500"}),  # the dashboard
        ("GET", {"Host": "localhost:15500", "Origin": "https://evil.example"}),  # a read a page may make
        ("GET", {"Host": "[::1]:15500"}),
    ],
)
def test_programs_and_the_servers_own_pages_are_served(method: str, headers: dict[str, str]) -> None:
    assert refusal(method, headers, loopback_only=True) is None


def test_a_loopback_server_answers_only_loopback_names() -> None:
    """DNS rebinding: the page's own name now points at 127.0.0.1, so its requests are same-origin."""
    rebound = {"Host": "attacker.example:15500", "Origin": "http://attacker.example:15500"}
    assert refusal("GET", rebound, loopback_only=True) is not None
    assert refusal("GET", rebound, loopback_only=False) is None  # listening on a network address
    assert [is_loopback_name(h) for h in ("127.0.0.2:80", "LOCALHOST", "a.localhost", "10.0.0.1")] == [
        True,
        True,
        True,
        False,
    ]
