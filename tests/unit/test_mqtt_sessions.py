"""The MQTT door's persistent sessions file: bounded, written off the event loop, crash-safe."""

from __future__ import annotations

import asyncio
import errno
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from meshplane.mesh.doors import mqtt_sessions
from meshplane.mesh.doors.mqtt_sessions import (
    MAX_SESSION_BYTES,
    MAX_SESSION_QUEUES,
    MAX_SESSIONS,
    MAX_SESSIONS_PER_USER,
    Sessions,
    StoredSession,
)
from meshplane.streams import files
from meshplane.streams.errors import LimitReached, StorageError
from tests.faults import FaultInjector


class Queues:
    """The node's queues as the sessions use them: made and deleted, by name."""

    def __init__(self) -> None:
        self.made: dict[str, list[str]] = {}
        self.saved: set[str] = set()  # made with saved=True (in the node's queues file)

    def create(
        self, name: str, patterns: list[str], vpn: str, who: object = None, *, saved: bool = True
    ) -> None:
        self.made[name] = patterns
        if saved:
            self.saved.add(name)

    def delete(self, name: str, vpn: str) -> bool:
        return self.made.pop(name, None) is not None


def sessions(root: Path, vpns: int = 1, queues: Queues | None = None, cap: int = 3600) -> Sessions:
    return Sessions(root, queues or Queues(), lambda: vpns, cap)  # type: ignore[arg-type]


def on_disk(root: Path) -> list[StoredSession]:
    return msgspec.json.decode((root / "mqtt-sessions.json").read_bytes(), type=list[StoredSession])


async def subscribe(store: Sessions, session: StoredSession, *filters: str) -> None:
    for topic_filter in filters:
        session.subscriptions[topic_filter] = (1, 1)
    await store.subscriptions_changed(session, [f.replace("/", ".") for f in session.subscriptions])


async def test_a_save_runs_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file was written and fsynced on the loop at every SUBSCRIBE (0.2-0.3 s of a 40 MB file):
    here the write waits until the loop has run something else, which it can only do if the write is
    in another thread."""
    store = sessions(tmp_path)
    session = store.open("default", "c1", 60)
    released = threading.Event()
    seen: list[bool] = []
    write = files.write_atomic

    def slow_write(*args: Any, **kwargs: Any) -> None:
        seen.append(released.wait(timeout=5))
        write(*args, **kwargs)

    monkeypatch.setattr(files, "write_atomic", slow_write)
    session.subscriptions["a/b"] = (1, 1)
    saving = store.subscriptions_changed(session, ["a.b"])
    asyncio.get_running_loop().call_soon(released.set)
    await saving
    assert seen
    assert all(seen), "the write held the loop"
    assert on_disk(tmp_path)[0].subscriptions == {"a/b": (1, 1)}
    await store.close()


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO], ids=errno.errorcode.get)
async def test_each_failed_file_operation_leaves_the_previous_file_whole(tmp_path: Path, error: int) -> None:
    dry = tmp_path / "dry"
    store = sessions(dry)
    first = store.open("default", "c1", 60)
    await subscribe(store, first, "a/b")
    with FaultInjector(dry).installed() as counter:
        await subscribe(store, first, "c/d")
    assert counter.count >= 4  # open, write, fsync, rename (and the directory's fsync)
    for fail_at in range(1, counter.count + 1):
        root = tmp_path / f"{error}-{fail_at}"
        store = sessions(root)
        session = store.open("default", "c1", 60)
        await subscribe(store, session, "a/b")
        before = (root / "mqtt-sessions.json").read_bytes()
        injector = FaultInjector(root, fail_at, error)
        with injector.installed(), pytest.raises(StorageError):
            await subscribe(store, session, "c/d")
        assert injector.failed is not None
        if injector.failed[1] != str(root.resolve()):  # before the rename (after it: the directory's fsync)
            assert (root / "mqtt-sessions.json").read_bytes() == before, injector.failed  # the old one
        assert not (root / "mqtt-sessions.json.tmp").exists()
        store.checkpoint()  # the next write puts it right
        await store.close()
        assert on_disk(root)[0].subscriptions == {"a/b": (1, 1), "c/d": (1, 1)}


async def test_a_session_and_all_sessions_are_bounded_in_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = sessions(tmp_path)
    session = store.open("default", "c1", 60)
    long = "x" * 1000
    taken = 0
    while store.room(session, f"{long}/{taken}"):
        taken += 1
    assert 55 < taken < MAX_SESSION_BYTES // 1000  # about 64 KiB of filters, then no more
    monkeypatch.setattr(mqtt_sessions, "MAX_SESSIONS_BYTES", 100_000)
    other = store.open("default", "c2", 60)
    more = 0
    while store.room(other, f"{long}/{more}"):
        more += 1
    assert more < 100_000 // 1000 - taken + 2  # the two together stay within the file's bound
    await store.close()


async def test_each_vpn_and_user_has_its_share_of_sessions_and_queues(tmp_path: Path) -> None:
    store = sessions(tmp_path, vpns=2)
    for i in range(MAX_SESSIONS_PER_USER):
        store.open("a", f"u{i}", 60, user="alice")
    with pytest.raises(LimitReached, match="user 'alice'"):
        store.open("a", "one-more", 60, user="alice")
    store.open("a", "bob's", 60, user="bob")  # another user of the VPN
    for i in range(MAX_SESSIONS // 2 - MAX_SESSIONS_PER_USER - 1):
        store.open("a", f"anon{i}", 60)
    with pytest.raises(LimitReached, match="Message VPN 'a'"):
        store.open("a", "past-the-share", 60)
    for i in range(MAX_SESSION_QUEUES // 2):
        await subscribe(store, store.by_key[("a", f"anon{i}")], f"t/{i}")
    with pytest.raises(LimitReached, match="QoS 1 subscriptions"):
        await subscribe(store, store.by_key[("a", "bob's")], "t/x")
    b = store.open("b", "b1", 60)
    await subscribe(store, b, "t/1")  # another VPN's shares are whole
    store.open("b", "b2", 60)
    await store.close()


async def test_sessions_expire_after_their_client_left_and_their_queues_go(tmp_path: Path) -> None:
    queues = Queues()
    store = sessions(tmp_path, queues=queues, cap=100)
    session = store.open("default", "c1", 100)
    await subscribe(store, session, "a/b")
    assert queues.made
    assert store.expire(1e12) == 0  # its client is connected
    session.left_at = 1000.0
    assert store.expire(1099.0) == 0
    assert store.expire(1100.0) == 1
    assert not queues.made
    assert store.get("default", "c1") is None
    await store.close()
    assert on_disk(tmp_path) == []


async def test_sessions_read_back_expire_as_if_their_client_left_at_the_restart(tmp_path: Path) -> None:
    """A node killed with clients connected: their sessions (left_at 0) would never have expired,
    and a session saved with no expiry (3.1.1's, before) is capped."""
    (tmp_path / "mqtt-sessions.json").write_bytes(
        msgspec.json.encode(
            [StoredSession("default", "c1", expiry=0xFFFFFFFF), StoredSession("default", "c2")]
        )
    )
    store = sessions(tmp_path, cap=100)
    assert {s.expiry for s in store.by_key.values()} == {100}
    assert store.expire(store.now() + 101) == 2
    await store.close()


async def test_a_sessions_queue_is_kept_with_it_and_made_again_from_its_file(tmp_path: Path) -> None:
    """A session's queue is left out of the node's queues file (rewritten whole, on the loop, at each
    change): the sessions read back on start make their queues again, from their QoS 1 filters."""
    queues = Queues()
    store = sessions(tmp_path, queues=queues)
    session = store.open("default", "c1", 100)
    session.subscriptions = {"a/+": (1, 0), "b/#": (0, 0)}
    await store.subscriptions_changed(session, ["a.*"])
    store.open("default", "c2", 100)  # no QoS 1 filter: no queue
    await store.close()
    assert queues.made == {session.queue: ["a.*"]}
    assert not queues.saved
    again = Queues()
    sessions(tmp_path, queues=again)
    assert again.made == {session.queue: ["a.*"]}
    assert not again.saved
