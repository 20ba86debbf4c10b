"""The queues' journal (``queues.log``) against a dict: random makes, changes and deletes, compactions,
ENOSPC/EIO injected at any file operation and reloads give back exactly the changes that returned."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplane.mesh import queue_journal as journal_module
from meshplane.mesh.queue_journal import QueueJournal
from tests.faults import FaultInjector

NAMES = st.sampled_from(["a", "b", "c", "d", "e"])
PATTERNS = st.lists(st.sampled_from(["x.>", "y.*", "z"]), max_size=2, unique=True)  # []: deleted
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), NAMES, PATTERNS, st.none()),
        st.tuples(
            st.just("fail"),
            NAMES,
            PATTERNS,
            st.tuples(st.integers(1, 6), st.sampled_from([errno.ENOSPC, errno.EIO])),
        ),
        st.tuples(st.just("reload"), NAMES, PATTERNS, st.none()),
    ),
    max_size=40,
)


def _after(state: dict[str, list[str]], name: str, patterns: list[str]) -> Callable[[], dict[str, list[str]]]:
    def after() -> dict[str, list[str]]:
        new = {k: v for k, v in state.items() if k != name}
        return new | {name: patterns} if patterns else new

    return after


@settings(max_examples=300, deadline=None)
@given(STEPS)
def test_the_journal_keeps_exactly_the_changes_that_returned(
    steps: list[tuple[str, str, list[str], object]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr(journal_module, "COMPACT_AFTER", 3)  # compactions within a few steps
        root = Path(tmp)
        journal = QueueJournal(root)
        model = journal.load()
        most = 0
        for op, name, patterns, fault in steps:
            most = max(most, len(model))
            after = _after(model, name, patterns)
            if op == "put":
                journal.put(name, patterns, after, len(model))
                model = after()
            elif op == "fail":
                assert isinstance(fault, tuple)
                injector = FaultInjector(root, fail_at=fault[0], error=fault[1])
                try:
                    with injector.installed():
                        journal.put(name, patterns, after, len(model))
                except OSError:
                    journal.close()
                    journal = QueueJournal(root)
                    loaded = journal.load()
                    assert injector.failed is not None
                    failed_path = Path(injector.failed[1])
                    if failed_path.is_dir():  # the rename's fsync: the new file is in, maybe durably
                        assert loaded in (model, after())
                    else:  # a failed write or fsync is taken off again
                        assert loaded == model
                    model = loaded
                else:
                    model = after()
            else:
                journal.close()
                journal = QueueJournal(root)
                assert journal.load() == model
        journal.close()
        assert QueueJournal(root).load() == model
        lines = (root / "queues.log").read_bytes().splitlines() if (root / "queues.log").exists() else []
        assert len(lines) <= journal_module.COMPACT_AFTER + 2 * most + 2  # compacted as it grew


@pytest.mark.parametrize(
    ("tail", "kept"),
    [(b'{"name":"b","patt', {}), (b'{"name":"b","patterns":["y"]}', {"b": ["y"]})],
    ids=["half_a_line", "all_but_the_newline"],
)
def test_a_torn_last_line_eats_no_later_change(
    tmp_path: Path, tail: bytes, kept: dict[str, list[str]]
) -> None:
    """A crash mid-append leaves part of a line (never acknowledged): half a line is dropped on load, a
    whole entry without its newline may stay; either way the next change is not glued to it."""
    journal = QueueJournal(tmp_path)
    journal.load()
    journal.put("a", ["x.>"], lambda: {"a": ["x.>"]}, 0)
    journal.close()
    with (tmp_path / "queues.log").open("ab") as file:
        file.write(tail)
    journal = QueueJournal(tmp_path)
    state = journal.load()
    assert state == {"a": ["x.>"]} | kept
    journal.put("c", ["z"], lambda: state | {"c": ["z"]}, len(state))
    journal.close()
    assert QueueJournal(tmp_path).load() == state | {"c": ["z"]}


def test_the_queues_json_of_older_versions_is_read_once_and_replaced(tmp_path: Path) -> None:
    (tmp_path / "queues.json").write_text('{"a":["x.>"],"b":["y.*"]}')
    assert QueueJournal(tmp_path).load() == {"a": ["x.>"], "b": ["y.*"]}
    assert not (tmp_path / "queues.json").exists()
    assert QueueJournal(tmp_path).load() == {"a": ["x.>"], "b": ["y.*"]}


def test_making_queues_appends_a_line_each_not_the_whole_file(tmp_path: Path) -> None:
    journal = QueueJournal(tmp_path)
    state: dict[str, list[str]] = {}
    sizes = []
    for i in range(200):
        state[f"q{i}"] = [f"q{i}.>"]
        journal.put(f"q{i}", [f"q{i}.>"], lambda: dict(state), len(state) - 1)
        sizes.append((tmp_path / "queues.log").stat().st_size)
    growth = [b - a for a, b in itertools.pairwise(sizes)]
    assert max(growth) < 64  # one short line each
    journal.close()
    assert QueueJournal(tmp_path).load() == state


GROUPS = st.lists(
    st.tuples(
        st.dictionaries(NAMES, PATTERNS, min_size=1, max_size=4),  # one change a queue, as Queues.make
        st.one_of(st.none(), st.tuples(st.integers(1, 8), st.sampled_from([errno.ENOSPC, errno.EIO]))),
        st.booleans(),  # a put (a delete, say) made while the commits wait
    ),
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(GROUPS)
def test_concurrent_commits_keep_exactly_the_changes_that_returned(
    groups: list[tuple[dict[str, list[str]], tuple[int, int] | None, bool]],
) -> None:
    """Changes committed at once share fsyncs (group commit, in worker threads); with ENOSPC/EIO at
    any file operation among them, a reload gives back every change that returned and none that
    raised (but for a failed fsync of the directory, after which a change may be kept or not)."""
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr(journal_module, "COMPACT_AFTER", 3)
        root = Path(tmp)
        journal = QueueJournal(root)
        model = journal.load()

        async def group(changes: dict[str, list[str]], put_too: bool) -> list[BaseException | None]:
            async def commit(name: str, patterns: list[str]) -> None:  # after(): applied ones and this
                number = await journal.commit(name, patterns, _after(model, name, patterns), len(model))
                if patterns:  # applied by its caller at once, as Queues.make does
                    model[name] = patterns
                else:
                    model.pop(name, None)
                journal.applied(number)

            tasks = [asyncio.ensure_future(commit(name, p)) for name, p in changes.items()]
            await asyncio.sleep(0)  # the first fsync under way: a put comes while it runs
            if put_too:
                try:
                    journal.put("e", [], _after(model, "e", []), len(model))
                    model.pop("e", None)
                except OSError:
                    pass
            return list(await asyncio.gather(*tasks, return_exceptions=True))

        for changes, fault, put_too in groups:
            changes = {k: v for k, v in changes.items() if k != "e"}
            injector = FaultInjector(root, fail_at=fault[0], error=fault[1]) if fault else None
            with injector.installed() if injector else contextlib.nullcontext():
                results = asyncio.run(group(changes, put_too))
            failed = {name: p for (name, p), r in zip(changes.items(), results, strict=True) if r is not None}
            journal.close()
            journal = QueueJournal(root)
            loaded = journal.load()
            dir_failed = (
                injector is not None and injector.failed is not None and Path(injector.failed[1]).is_dir()
            )
            for name in set(loaded) | set(model) | set(failed):
                if dir_failed and name in failed and loaded.get(name) == (failed[name] or None):
                    continue
                assert loaded.get(name) == model.get(name), name
            model = loaded
        journal.close()
        assert QueueJournal(root).load() == model
