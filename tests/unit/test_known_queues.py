"""KnownQueues: each peer's (or other cluster's) queue patterns, matched, remembered on disk, and
every change heard once."""

from __future__ import annotations

from pathlib import Path

from meshplane.mesh.peer_queues import KnownQueues


class Heard:
    def __init__(self) -> None:
        self.changes: list[tuple[str, set[str], set[str]]] = []

    def __call__(self, key: str, added: set[str], removed: set[str]) -> None:
        if added or removed:
            self.changes.append((key, added, removed))


def test_changes_are_matched_heard_and_remembered_across_a_restart(tmp_path: Path) -> None:
    heard = Heard()
    known = KnownQueues(tmp_path, "cluster_queues.log", heard)
    known.load()
    known.learnt("B", {"orders.>", "audit.*"}, ())
    known.learnt("C", {"orders.eu"}, ())
    assert known.match("orders.eu") == {"B", "C"}
    assert known.match("audit.x") == {"B"}
    known.learnt("B", (), {"audit.*"})
    known.replace("C", {"billing.>"})  # C's interest learnt afresh
    assert known.match("orders.eu") == {"B"}
    assert heard.changes == [
        ("B", {"orders.>", "audit.*"}, set()),
        ("C", {"orders.eu"}, set()),
        ("B", set(), {"audit.*"}),
        ("C", {"billing.>"}, {"orders.eu"}),
    ]
    known.close()

    again = Heard()
    reopened = KnownQueues(tmp_path, "cluster_queues.log", again)
    reopened.load()
    assert reopened.by_key == {"B": {"orders.>"}, "C": {"billing.>"}}
    assert sorted(key for key, _, _ in again.changes) == ["B", "C"]  # held again before any link
    assert reopened.forget("B") == 1
    assert reopened.match("orders.x") == set()
    assert again.changes[-1] == ("B", set(), {"orders.>"})
    reopened.close()
    assert KnownQueues(tmp_path, "cluster_queues.log", Heard()).by_key == {}  # nothing loaded yet


def test_a_replace_with_the_same_patterns_writes_and_tells_nothing(tmp_path: Path) -> None:
    heard = Heard()
    known = KnownQueues(tmp_path, "peer_queues.log", heard)
    known.replace("b", {"x.>"})
    size = (tmp_path / "peer_queues.log").stat().st_size
    known.replace("b", {"x.>"})
    known.learnt("b", {"x.>"}, ())
    assert (tmp_path / "peer_queues.log").stat().st_size == size
    assert heard.changes == [("b", {"x.>"}, set())]
    known.close()


def test_a_garbage_pattern_on_disk_is_not_held(tmp_path: Path) -> None:
    (tmp_path / "peer_queues.log").write_bytes(b'{"peer":"b","add":["ok.>","bad..x"]}\n')
    known = KnownQueues(tmp_path, "peer_queues.log", Heard())
    known.load()
    assert known.by_key == {"b": {"ok.>"}}
    known.close()
