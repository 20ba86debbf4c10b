"""The data directory's mirror (HA mates on separate machines): what the active sends is exactly what
makes the standby's copy equal, whatever the storage did in between (appends, cuts, replacements,
removals of files and trees), and a mate never writes outside its directory."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplane.core.mirror import MAX_PUT_BYTES, Put, Remove, Reset, SentFiles, checked_path, puts
from meshplane.streams.files import changed, write_atomic
from meshplane.streams.mirror import DirectoryReplica, DirectorySource


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` but a mate's own, by relative path."""
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name not in (".lock", ".mate-id")
    }


def test_a_file_is_sent_whole_when_new_or_replaced_its_tail_when_it_grew_and_cut_when_it_shrank() -> None:
    sent = SentFiles()
    assert sent.delta("t/0/a.log", inode=7, size=10) == (0, 10)
    sent.record("t/0/a.log", 7, 10)
    assert sent.delta("t/0/a.log", inode=7, size=10) is None
    assert sent.delta("t/0/a.log", inode=7, size=25) == (10, 25)
    assert sent.delta("t/0/a.log", inode=7, size=4) == (4, 4)
    assert sent.delta("t/0/a.log", inode=8, size=3) == (0, 3)  # os.replace: a new inode
    sent.cut("t/0/a.log", 6)  # a failed append taken back, then appends again: resent from the cut
    assert sent.delta("t/0/a.log", inode=7, size=10) == (6, 10)
    sent.record("t/1/b.log", 9, 1)
    assert sent.removed("t")
    assert sent.files == {}
    assert not sent.removed("t")


def test_large_deltas_are_split_and_an_empty_one_still_cuts() -> None:
    parts = puts("f", 5, b"x" * (2 * MAX_PUT_BYTES + 3))
    assert [(p.offset, len(p.data)) for p in parts] == [
        (5, MAX_PUT_BYTES),
        (5 + MAX_PUT_BYTES, MAX_PUT_BYTES),
        (5 + 2 * MAX_PUT_BYTES, 3),
    ]
    assert puts("f", 9, b"") == [Put("f", 9, b"")]


@pytest.mark.parametrize(
    "bad", ["", "/etc/passwd", "../x", "a/../../x", "a//b", ".lock", ".mate-id", "a\x00b"]
)
def test_a_path_outside_the_directory_or_naming_a_mates_own_file_is_refused(bad: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mirror path"):
        checked_path(bad)
    replica = DirectoryReplica(tmp_path / "copy")
    with pytest.raises(ValueError, match="mirror path"):
        replica.apply(Put(bad, 0, b"owned"))
    with pytest.raises(ValueError, match="mirror path"):
        replica.apply(Remove(bad))
    assert not (tmp_path / "owned").exists()
    assert list((tmp_path / "copy").iterdir()) == []


def test_reset_empties_the_copy_but_keeps_the_mates_own_files(tmp_path: Path) -> None:
    replica = DirectoryReplica(tmp_path)
    for name in (".lock", ".mate-id", "stale/x.log", "old.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"1")
    replica.apply(Reset())
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", ".mate-id"]


# A model of what the storage does to a directory, each step reported as the storage reports it.
Step = tuple[str, str, bytes]
NAMES = st.sampled_from(
    ["a/0/seg.log", "a/1/seg.log", "a/topic.json", "b/x.offsets", "queues.json", "c/d/e.log"]
)
STEPS = st.lists(
    st.tuples(
        st.sampled_from(["append", "replace", "cut", "remove", "rmtree", "round"]),
        NAMES,
        st.binary(max_size=64),
    ),
    max_size=40,
)


def apply_step(root: Path, kind: str, name: str, data: bytes) -> None:
    path = root / name
    if kind == "append":
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as f:
            f.write(data)
        changed(path)
    elif kind == "replace":
        write_atomic(path, data, sync=False)
    elif kind == "cut" and path.exists():
        size = min(len(data), path.stat().st_size)
        os.truncate(path, size)
        changed(path, cut=size)
    elif kind == "remove" and path.exists():
        path.unlink()
        changed(path)
    elif kind == "rmtree":
        top = root / name.split("/", 1)[0]
        if top.is_dir():
            shutil.rmtree(top)
            changed(top)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=STEPS, after=STEPS)
def test_the_copy_equals_the_directory_after_every_round(
    tmp_path_factory: pytest.TempPathFactory, before: list[Step], after: list[Step]
) -> None:
    root = tmp_path_factory.mktemp("active")
    copy = DirectoryReplica(tmp_path_factory.mktemp("standby"))
    (root / ".lock").write_bytes(b"pid")
    for step in before:  # what was there before the standby connected
        apply_step(root, *step)
    source = DirectorySource(root)
    try:
        for change in source.snapshot():
            copy.apply(change)
        assert tree(copy.root) == tree(root)
        for kind, name, data in after:
            if kind == "round":
                for change in source.changes():
                    copy.apply(change)
                assert tree(copy.root) == tree(root)
            else:
                apply_step(root, kind, name, data)
        for change in source.changes():
            copy.apply(change)
        assert tree(copy.root) == tree(root)
    finally:
        source.close()


def test_a_file_the_active_replaced_and_fsynced_is_replaced_and_fsynced_on_the_mate_too(
    tmp_path: Path,
) -> None:
    """Metadata (queues.json, topic.json) is replaced synced even with --fsync interval: a standby that
    loses power must not come back with it torn, as the active never would."""
    root = tmp_path / "active"
    root.mkdir()
    source = DirectorySource(root)
    try:
        write_atomic(root / "queues.json", b"{}", sync=True)
        write_atomic(root / "acked", b"7", sync=False)
        (put_synced,) = [c for c in source.changes() if isinstance(c, Put) and c.path == "queues.json"]
        assert put_synced.sync
        (put_unsynced,) = [c for c in source.snapshot() if isinstance(c, Put) and c.path == "acked"]
        assert not put_unsynced.sync
    finally:
        source.close()


def test_a_directory_removed_while_the_snapshot_is_read_is_not_an_error(tmp_path: Path) -> None:
    root = tmp_path / "active"
    (root / "t" / "0").mkdir(parents=True)
    (root / "t" / "0" / "seg.log").write_bytes(b"abc")
    (root / "u").mkdir()
    (root / "u" / "x").write_bytes(b"x")
    source = DirectorySource(root)
    copy = DirectoryReplica(tmp_path / "copy")
    try:
        snapshot = source.snapshot()
        copy.apply(next(snapshot))  # Reset
        shutil.rmtree(root / "t")
        changed(root / "t")
        for change in snapshot:
            copy.apply(change)
        for change in source.changes():
            copy.apply(change)
        assert tree(copy.root) == tree(root) == {"u/x": b"x"}
    finally:
        source.close()


async def test_a_streams_server_reopened_on_the_copy_holds_what_the_active_acknowledged(
    tmp_path: Path,
) -> None:
    """The storage reports every change it makes (topics, rooms, groups, idempotency answers, segment
    rolls, retention, deletions): the copy, brought up to date after each batch, opens as a server
    with the same events, offsets and commits."""
    from meshplane.core.streamlog import StoredEvent
    from meshplane.streams.service import StreamsConfig, StreamsService

    active = tmp_path / "active"
    copy = DirectoryReplica(tmp_path / "standby")
    engine = StreamsService(StreamsConfig(data_dir=active, segment_bytes=4096, room_max_events=50))
    source = DirectorySource(active)
    await engine.start()
    try:
        for change in source.snapshot():
            copy.apply(change)

        def round_trip() -> None:
            for change in source.changes():
                copy.apply(change)

        await engine.create_topic("kept", 2)
        await engine.create_topic("dropped", 1)
        await engine.create_room("chat", max_events=50)
        await engine.create_group("g", "kept")
        for i in range(300):  # several segments per partition (4 KiB each), the room past its ring
            await engine.publish_topic(
                "kept", [StoredEvent(f"id{i}", "e", {"i": i}, f"k{i % 7}")], None, f"key{i}"
            )
            await engine.publish_room("chat", "said", {"i": i})
            if i % 37 == 0:
                round_trip()
        await engine.publish_topic("dropped", [StoredEvent("x", "e", {}, None)])
        round_trip()
        await engine.delete_topic("dropped")
        await engine.commit("g", 0, 120, None, None)
        round_trip()
        expected = [await engine.read_topic("kept", p, 0, 1000, counted=False) for p in (0, 1)]
        expected_room = engine.read_room("chat", -1000, 1000)[1]
    finally:
        await engine.close()
        source.close()
    assert tree(copy.root) == tree(active)

    standby = StreamsService(StreamsConfig(data_dir=copy.root, segment_bytes=4096, room_max_events=50))
    await standby.start()
    try:
        assert sorted(standby.topics) == ["kept"]
        for p in (0, 1):
            got = await standby.read_topic("kept", p, 0, 1000, counted=False)
            assert [(e.offset, e.body) for e in got] == [(e.offset, e.body) for e in expected[p]]
        assert [e.body for e in standby.read_room("chat", -1000, 1000)[1]] == [e.body for e in expected_room]
        assert len(expected_room) == 50
        assert standby.group("g").committed.get(0) == 120
        # An idempotent publish repeated on the copy is answered from the mirrored answers, not appended.
        again = await standby.publish_topic("kept", [StoredEvent("id5", "e", {"i": 5}, "k5")], None, "key5")
        assert again[0][1] < 300
    finally:
        await standby.close()
