"""The node's direct path: ``route_events`` in C (``_frames.c``) against the Python reference
(``core/mesh/direct.py``) on any stream, route table, write-buffer limit and dedup state: the same
offset, runs, buffers and dedup ids, in the same order."""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from meshplane.core.mesh import direct
from meshplane.core.mesh.frames import FrameType, encode_event, encode_frame
from meshplane.core.subjects import MAX_SUBJECT_BYTES
from tests.unit.test_mesh_frames_native import damaged

MAX_PAYLOAD = 400
SOURCES = ["a", "node-b", "n" * 16, "é"]
SUBJECTS = ["x.y", "orders.eu", "ünï.cødé", "z" * 40]


def test_the_extension_has_the_direct_path() -> None:
    assert direct.native_route_events is not None, "the C extension was not built"


PLAIN = st.builds(  # from a small pool, so that the same event comes again (a duplicate)
    lambda source, subject, sequence, stamp, body, flags: encode_event(
        source, subject, sequence, stamp, body, flags
    ),
    st.sampled_from(SOURCES[:1] * 6 + SOURCES[1:]),
    st.sampled_from(SUBJECTS[:2] * 3 + SUBJECTS[2:]),
    st.integers(0, 3),
    st.sampled_from([0, 1, 1, 2**64 - 1]),
    st.sampled_from([b"", b"body", b"x" * 60]),
    st.sampled_from([0] * 12 + [1, 4]),
)
OTHER = st.builds(  # damaged or of another kind: both stop there
    lambda kind, source, subject, how, where: damaged(
        encode_frame(kind, source, subject, 7, b"12345678"), how, where
    ),
    st.sampled_from([FrameType.EVENT, FrameType.HEARTBEAT, FrameType.SUB_ADD]),
    st.sampled_from(SOURCES),
    st.sampled_from(SUBJECTS),
    st.sampled_from(["none", "flip", "type", "text", "subject", "payload_length", "short_event"]),
    st.integers(0, 1000),
)
FRAME = st.one_of(PLAIN, PLAIN, PLAIN, PLAIN, PLAIN, PLAIN, OTHER)


@st.composite
def tables(draw: st.DrawFn) -> tuple[dict[bytes, direct.Entry], list[bytearray]]:
    buffers = [bytearray(draw(st.binary(max_size=30))) for _ in range(3)]
    table: dict[bytes, direct.Entry] = {}
    for subject in draw(st.lists(st.sampled_from(SUBJECTS), unique=True, min_size=3)):
        ids: OrderedDict[Hashable, float] | None = None
        if draw(st.booleans()):
            ids = OrderedDict()
            for stamp, sequence, source in draw(
                st.lists(st.tuples(st.sampled_from([0, 1]), st.integers(0, 3), st.sampled_from(SOURCES)))
            ):
                ids[(stamp, sequence, source, "p")] = 1.0
        chosen = draw(st.lists(st.integers(0, 2), unique=True, min_size=1))
        table[subject.encode()] = (subject, ids, tuple(buffers[i] for i in chosen))
    return table, buffers


@settings(max_examples=600)
@given(
    st.one_of(st.lists(PLAIN, min_size=1, max_size=16), st.lists(FRAME, min_size=1, max_size=16)),
    st.one_of(st.just(0), st.integers(0, 40)),
    tables(),
    st.sampled_from([None, None, None, "a", "node-b"]),
    st.sampled_from([SOURCES, SOURCES, SOURCES, SOURCES[:2], SOURCES[1:], []]),
    st.sampled_from([60, 300, 1 << 20, 1 << 20]),
    st.integers(1, 4),
)
def test_c_and_python_route_the_same(
    frames: list[bytes],
    cut: int,
    table_and_buffers: tuple[dict[bytes, direct.Entry], list[bytearray]],
    origin: str | None,
    known: list[str],
    limit: int,
    per_topic: int,
) -> None:
    assert direct.native_route_events is not None
    stream = b"".join(frames)
    stream = stream[: len(stream) - cut] if cut < len(stream) else stream
    raw_origin = origin.encode().ljust(16, b"\x00") if origin is not None else None
    text = {source.encode().ljust(16, b"\x00"): source for source in known}
    outcomes: list[Any] = []
    for route in (direct.route_events, direct.native_route_events):
        table, buffers = copy.deepcopy(table_and_buffers)
        runs: list[tuple[Any, int, int]] = []
        end = route(
            stream,
            0,
            MAX_PAYLOAD,
            MAX_SUBJECT_BYTES,
            raw_origin,
            text,
            table,
            limit,
            "p",
            2.0,
            per_topic,
            runs,
        )
        ids = {key: list(entry[1].items()) for key, entry in table.items() if entry[1] is not None}
        outcomes.append((end, runs, [bytes(b) for b in buffers], ids))
    assert outcomes[0] == outcomes[1]
