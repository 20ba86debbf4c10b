"""The retained messages' journal (``mqtt-retained.log``) against a dict: retained PUBLISHes and clears,
compactions, ENOSPC/EIO injected at any file operation and reloads (a SIGKILL's view: what is in the
file) give back every put that returned: an acknowledged retained message is never lost."""

from __future__ import annotations

import errno
import itertools
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplane.mesh.doors import mqtt_retained_journal as journal_module
from meshplane.mesh.doors.mqtt_retained import RetainedStore
from meshplane.mesh.doors.mqtt_retained_journal import JOURNAL
from tests.faults import FaultInjector

TOPICS = st.sampled_from(["t.a", "t.b", "t.c", "t.d"])
PAYLOADS = st.sampled_from([b"", b"1", b"22", b"333"])  # b"": a clear
FAULTS = st.tuples(st.integers(1, 6), st.sampled_from([errno.ENOSPC, errno.EIO]))
STEPS = st.lists(
    st.tuples(st.sampled_from(["put", "fail", "reload"]), TOPICS, PAYLOADS, FAULTS),
    max_size=40,
)


def _open(root: Path, clock: itertools.count[int], policy: str) -> RetainedStore:
    store = RetainedStore(origin="a", clock=lambda: next(clock))
    store.open(root, policy)
    return store


def _held(store: RetainedStore) -> dict[str, bytes]:
    return {record.subject: record.payload for record in store.table.live("default")}


@settings(max_examples=300, deadline=None)
@given(STEPS, st.sampled_from(["always", "interval", "never"]))
def test_every_retained_put_that_returned_is_there_after_a_reload(
    steps: list[tuple[str, str, bytes, tuple[int, int]]], policy: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr(journal_module, "COMPACT_AFTER", 3)  # compactions within a few steps
        root, clock = Path(tmp), itertools.count(1_000_000)
        store = _open(root, clock, policy)
        model: dict[str, bytes] = {}
        for op, topic, payload, (fail_at, error) in steps:
            after = {k: v for k, v in model.items() if k != topic} | ({topic: payload} if payload else {})
            if op == "put":
                assert store.put(topic, payload, 1) is not None
                model = after
            elif op == "fail":
                injector = FaultInjector(root, fail_at=fail_at, error=error)
                try:
                    with injector.installed():
                        store.put(topic, payload, 1)
                except OSError:
                    assert _held(store) == model  # not acknowledged: not kept in memory either
                    store.close()
                    store = _open(root, clock, policy)
                    assert injector.failed is not None
                    if Path(injector.failed[1]).is_dir():  # the rename's fsync: the new file may be in
                        assert _held(store) in (model, after)
                    else:
                        assert _held(store) == model
                    model = _held(store)
                else:
                    model = after
            else:
                store.close()
                store = _open(root, clock, policy)
                assert _held(store) == model
        store.close()
        assert _held(_open(root, clock, policy)) == model


def test_a_torn_last_line_is_dropped_and_the_next_put_not_glued_to_it(tmp_path: Path) -> None:
    clock = itertools.count(1_000_000)
    store = _open(tmp_path, clock, "always")
    store.put("t.a", b"kept", 1)
    store.close()
    with (tmp_path / JOURNAL).open("ab") as journal:
        journal.write(b'["t.b","dG9y')  # a crash mid-append: never acknowledged
    store = _open(tmp_path, clock, "always")
    assert _held(store) == {"t.a": b"kept"}
    store.put("t.c", b"after", 1)
    store.close()
    assert _held(_open(tmp_path, clock, "always")) == {"t.a": b"kept", "t.c": b"after"}


def test_a_clock_set_back_since_they_were_written_loses_no_retained_message(tmp_path: Path) -> None:
    store = _open(tmp_path, itertools.count(10_000_000), "always")
    store.put("t.a", b"kept", 1)
    store.close()
    assert _held(_open(tmp_path, itertools.count(1_000_000), "always")) == {"t.a": b"kept"}  # 9,000 s back
