"""Which publishers `meshplane sub SCOPE TOPIC` reaches, and the near misses it names. Pure."""

from __future__ import annotations

from meshplane.cli.matching import is_under, match_publishers
from meshplane.core.names import Scope
from meshplane.core.records import EventChannel


def channel(scope: str, topic: str, instance: int) -> EventChannel:
    return EventChannel(Scope.parse(scope), topic, instance, "zmq", {"endpoint": "tcp://127.0.0.1:1"})


CHANNELS = [
    channel("ns/comp/a", "kv-events", 1),
    channel("ns/comp/b", "kv-events", 2),
    channel("ns/comp/b", "kv-events", 3),
    channel("ns/other/a", "metrics", 4),
    channel("elsewhere/comp/a", "kv-events", 5),
]


def test_under() -> None:
    assert is_under(Scope.parse("ns"), Scope.parse("ns/comp/a"))
    assert is_under(Scope.parse("ns/comp"), Scope.parse("ns/comp"))
    assert not is_under(Scope.parse("ns/comp"), Scope.parse("ns/other/a"))
    assert not is_under(Scope.parse("ns/comp/a"), Scope.parse("ns/comp"))


def test_the_exact_scope_wins_else_everything_below() -> None:
    exact = match_publishers(Scope.parse("ns/comp/b"), "kv-events", CHANNELS)
    assert exact.reached == {Scope.parse("ns/comp/b"): 2}
    below = match_publishers(Scope.parse("ns/comp"), "kv-events", CHANNELS)
    assert below.reached == {Scope.parse("ns/comp/a"): 1, Scope.parse("ns/comp/b"): 2}
    assert below.describe() == "kv-events: 3 publisher(s) in ns/comp/a (1), ns/comp/b (2)"


def test_nothing_reached_names_what_is_near() -> None:
    typo = match_publishers(Scope.parse("ns/comp"), "kv-event", CHANNELS)
    assert typo.reached == {}
    assert "did you mean topic kv-events?" in typo.describe()
    wrong_scope = match_publishers(Scope.parse("ns/other"), "kv-events", CHANNELS)
    assert wrong_scope.describe() == (
        "no publisher of kv-events in ns/other or below; topics there: metrics; "
        "kv-events is published in elsewhere/comp/a, ns/comp/a, ns/comp/b"
    )
    empty = match_publishers(Scope.parse("new"), "t", [])
    assert empty.describe() == "no publisher of t in new or below; nothing is registered there yet"
