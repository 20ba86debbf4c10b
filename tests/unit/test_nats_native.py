"""The NATS door's C fast path (``core/doors/_nats.c``) against the Python codec, its reference: the
same operations and the same errors on any stream, split at every byte; ``route_pubs`` takes the PUBs
and HPUBs the Python path would route without a check of its own (no reply subject) and makes the EVENT
frames the node's Python path makes of them (an HPUB's payload in ``wrap``'s envelope)."""

from __future__ import annotations

import itertools
import zlib
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from meshplane.core.doors.nats_protocol import (
    MAX_CONTROL_LINE,
    NatsParser,
    NatsProtocolError,
    Op,
    Pub,
    encode_pub,
    native_parse_pubs,
    native_route_pubs,
    wrap,
)
from meshplane.core.mesh.frames import FLAG_NATS_ENVELOPE, encode_event

pytestmark = pytest.mark.skipif(native_parse_pubs is None, reason="the C extension is not built")

MAX_CONTROL = 96
MAX_PAYLOAD = 64
token = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-$*>", min_size=1, max_size=10)
subjects = st.lists(token, min_size=1, max_size=4).map(".".join)
blocks = st.lists(st.tuples(token, token), max_size=3).map(
    lambda pairs: b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in pairs) + b"\r\n"
)


def encoded(
    subject: str, reply: str, payload: bytes, headers: bytes | None, spaces: int, verb: bytes
) -> bytes:
    """encode_pub's bytes with ``spaces`` between the arguments and the verb as given."""
    raw = encode_pub(subject, reply, payload, headers)
    line, _, rest = raw.partition(b"\r\n")
    words = line.split(b" ")
    return (verb + b" " + (b" " * spaces).join(words[1:])) + b"\r\n" + rest


@st.composite
def pieces(draw: st.DrawFn) -> bytes:
    """Mostly PUBs and HPUBs, some odd in ways the C loop leaves to Python, some broken."""
    kind = draw(st.sampled_from(["pub", "pub", "hpub", "odd", "other", "broken", "long", "big"]))
    subject, reply = draw(subjects), draw(st.one_of(st.just(""), subjects))
    payload = draw(st.binary(max_size=MAX_PAYLOAD))
    if kind == "pub":
        return encoded(subject, reply, payload, None, draw(st.integers(1, 3)), b"PUB")
    if kind == "hpub":
        return encoded(subject, reply, payload, draw(blocks), draw(st.integers(1, 2)), b"HPUB")
    if kind == "odd":  # what the reference takes and C leaves to it
        return draw(
            st.sampled_from(
                [
                    f"pub {subject} {len(payload)}\r\n".encode() + payload + b"\r\n",
                    f"PUB\t{subject} {len(payload)}\r\n".encode() + payload + b"\r\n",
                    f"PUB {subject}\t{len(payload)}\r\n".encode() + payload + b"\r\n",
                    f"PUB {subject} {len(payload)}\r\r\n".encode() + payload + b"\r\n",
                    f"PUB {subject} {len(payload)}\n".encode() + payload + b"\r\n",
                    f" PUB {subject} {len(payload)}\r\n".encode() + payload + b"\r\n",
                    f"PUB {subject} {len(payload):03d}\r\n".encode() + payload + b"\r\n",
                    f"PUB {subject}\xe9 {len(payload)}\r\n".encode() + payload + b"\r\n",
                ]
            )
        )
    if kind == "other":
        return draw(st.sampled_from([b"PING\r\n", b"PONG\r\n", f"SUB {subject} 1\r\n".encode(), b"+OK\r\n"]))
    if kind == "long":  # a control line at the limit or one past it
        size = MAX_CONTROL - len(f"PUB  {len(payload)}") + draw(st.integers(-1, 1))
        return f"PUB {'s' * max(size, 1)} {len(payload)}\r\n".encode() + payload + b"\r\n"
    if kind == "big":  # a payload at the limit or one past it
        size = MAX_PAYLOAD + draw(st.integers(-1, 1))
        return f"PUB {subject} {size}\r\n".encode() + b"x" * size + b"\r\n"
    return draw(
        st.sampled_from(
            [
                f"PUB {subject} {len(payload) + 1}\r\n".encode() + payload + b"\r\n",  # the size is wrong
                f"PUB {subject} x\r\n".encode(),
                f"PUB {subject} 1234567890123\r\n".encode(),
                f"PUB {subject} {reply or 'r'} {reply or 'r'} 1\r\nx\r\n".encode(),
                f"HPUB {subject} 11 11\r\n".encode() + b"NATS/1.0\r\n\r" + b"\r\n",  # headers too short
                f"HPUB {subject} 12 12\r\n".encode() + b"NATS/1.1\r\n\r\n" + b"\r\n",
                f"HPUB {subject} 13 12\r\n".encode() + b"NATS/1.0\r\n\r\n" + b"\r\n",
                f"HPUB {subject} 12 12\r\n".encode() + b"NATS/1.0\r\n\r\nX\r\n",
                b"PUB\r\n",
                b"\r\n",
            ]
        )
    )


def python_reads(stream: bytes, cuts: list[int]) -> tuple[list[Op], str | None]:
    parser = NatsParser(max_control=MAX_CONTROL, max_payload=MAX_PAYLOAD)
    read: list[Op] = []
    try:
        for chunk in chunks(stream, cuts):
            read += parser.feed(chunk)
    except NatsProtocolError as exc:
        return read, exc.message
    return read, None


def native_reads(stream: bytes, cuts: list[int]) -> tuple[list[Op], str | None]:
    assert native_parse_pubs is not None
    parser = NatsParser(max_control=MAX_CONTROL, max_payload=MAX_PAYLOAD)
    read: list[Op] = []

    def fast(buffer: bytearray, start: int) -> int:
        out: list[tuple[str, str, bytes, bytes | None]] = []
        end = native_parse_pubs(buffer, start, MAX_PAYLOAD, MAX_CONTROL, out)
        read.extend(Pub(*item) for item in out)
        return end

    try:
        for chunk in chunks(stream, cuts):
            parser.read(chunk, read.append, fast)
    except NatsProtocolError as exc:
        return read, exc.message
    return read, None


def chunks(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = [0, *sorted({c % (len(stream) + 1) for c in cuts}), len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(points)]


@given(st.lists(pieces(), max_size=8), st.lists(st.integers(0, 10**4), max_size=6))
@example([b"PUB a 5\r\nhello\r\n", b"HPUB b r 12 13\r\nNATS/1.0\r\n\r\nx\r\n"], [])
@example([b"PUB a 5\r\nhelloX"], [])
def test_the_c_loop_reads_what_the_reference_reads(parts: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(parts)
    assert_same(stream, cuts)


def assert_same(stream: bytes, cuts: list[int]) -> None:
    """The same operations and error; but what was read before a broken operation of the same read is
    handled (``feed`` loses a read's operations with its error), as a byte per read would be."""
    read, error = native_reads(stream, cuts)
    expected, expected_error = python_reads(stream, cuts)
    assert error == expected_error
    if error is None:
        assert read == expected
    else:
        each, _ = python_reads(stream, list(range(len(stream))))
        assert expected == read[: len(expected)]
        assert read == each[: len(read)]


@given(st.lists(pieces(), min_size=1, max_size=4))
def test_split_at_every_byte(parts: list[bytes]) -> None:
    stream = b"".join(parts)
    for cut in range(len(stream) + 1):
        assert_same(stream, [cut])
    assert_same(stream, list(range(len(stream))))  # a byte per read


@given(st.binary(max_size=300), st.integers(0, 300))
def test_any_bytes(data: bytes, cut: int) -> None:
    assert_same(data, [cut])


def test_it_takes_whole_plain_operations_and_stops_at_the_rest() -> None:
    assert native_parse_pubs is not None
    stream = b"PUB a 2\r\nhi\r\nHPUB b r 12 14\r\nNATS/1.0\r\n\r\nyo\r\nPING\r\nPUB c 1\r\nx\r\n"
    out: list[tuple[str, str, bytes, bytes | None]] = []
    end = native_parse_pubs(stream, 0, 1024, MAX_CONTROL_LINE, out)
    assert out == [("a", "", b"hi", None), ("b", "r", b"yo", b"NATS/1.0\r\n\r\n")]
    assert stream[end:].startswith(b"PING")
    assert native_parse_pubs(stream, len(stream) - 3, 1024, MAX_CONTROL_LINE, out) == len(stream) - 3


SOURCE = "node-a"
RAW_SOURCE = SOURCE.encode().ljust(16, b"\x00")


def event_of(subject: str, sequence: int, timestamp: int, payload: bytes, headers: bytes | None) -> bytes:
    """The frame the node's Python path makes of a NATS client's PUB/HPUB without a reply
    (``NatsClient.publish``, then ``MeshNode.publish``)."""
    if headers is None:
        return encode_event(SOURCE, "vpn." + subject, sequence, timestamp, payload)
    body = wrap("", headers, payload)
    return encode_event(SOURCE, "vpn." + subject, sequence, timestamp, body, FLAG_NATS_ENVELOPE)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a.b", "c", "other"]),
            st.binary(max_size=40),
            st.one_of(st.none(), blocks),
        ),
        max_size=12,
    ),
    st.integers(0, 2**40),
    st.integers(0, 2**41),
    st.integers(60, 400),
)
def test_route_pubs_makes_the_nodes_frames(
    pubs: list[tuple[str, bytes, bytes | None]], sequence: int, timestamp: int, limit: int
) -> None:
    assert native_route_pubs is not None
    stream = b"".join(encode_pub(s, "", p, h) for s, p, h in pubs) + b"PUB r x 1\r\nz\r\n"
    one, two = bytearray(), bytearray()
    info: dict[str, Any] = {"a.b": object(), "c": object()}
    table = {
        b"a.b": (info["a.b"], b"vpn.a.b", (one, two)),
        b"c": (info["c"], b"vpn.c", (one,)),
    }
    runs: list[tuple[Any, int, int]] = []
    end = native_route_pubs(
        stream, 0, 1024, MAX_CONTROL_LINE, table, RAW_SOURCE, sequence, timestamp, limit, runs, True
    )
    taken = sum(events for _, events, _ in runs)
    routed = pubs[:taken]
    assert end == sum(len(encode_pub(s, "", p, h)) for s, p, h in routed)
    assert all(subject != "other" for subject, _, _ in routed)
    frames = [
        (subject, event_of(subject, sequence + i, timestamp, payload, headers))
        for i, (subject, payload, headers) in enumerate(routed)
    ]
    assert bytes(one) == b"".join(frame for _, frame in frames)
    assert bytes(two) == b"".join(frame for subject, frame in frames if subject == "a.b")
    if taken < len(pubs) and pubs[taken][0] != "other":  # it stopped before a buffer went past limit
        subject, payload, headers = pubs[taken]
        following = event_of(subject, sequence + taken, timestamp, payload, headers)
        targets = (one, two) if subject == "a.b" else (one,)
        assert any(target and len(target) + len(following) > limit for target in targets)
    assert [(info_, events) for info_, events, _ in runs] == [
        (info[subject], len(run)) for subject, run in runs_of([s for s, _, _ in routed])
    ]
    for frame in (frame for _, frame in frames):
        assert zlib.crc32(frame[:-4]).to_bytes(4, "big") == frame[-4:]


@given(st.lists(pieces(), max_size=8), st.booleans(), st.sets(subjects, max_size=3))
@example([b"HPUB a 12 14\r\nNATS/1.0\r\n\r\nhi\r\n", b"PUB a 1\r\nx\r\n"], False, set())
@example([b"PUB a r 1\r\nx\r\n", b"PUB a 1\r\nx\r\n"], True, set())
def test_route_pubs_takes_only_what_the_python_path_routes_plainly(
    parts: list[bytes], headers: bool, unknown: set[str]
) -> None:
    """On any stream (replies, odd spellings, broken operations): the operations C takes are the
    reference parser's first ones, each a PUB without a reply (an HPUB only where the client said
    ``headers``) on a subject the table knows, routed as the node would route it; the reference reads
    the rest from where C stopped exactly as it reads it from the whole stream."""
    assert native_route_pubs is not None
    stream = b"".join(parts)
    expected, error = python_reads(stream, [])
    out = bytearray()
    known = {op.subject for op in expected if isinstance(op, Pub)} - unknown
    table = {subject.encode(): (subject, b"vpn." + subject.encode(), (out,)) for subject in known}
    runs: list[tuple[Any, int, int]] = []
    end = native_route_pubs(
        stream, 0, MAX_PAYLOAD, MAX_CONTROL, table, RAW_SOURCE, 7, 9, 1 << 20, runs, headers
    )
    taken = sum(events for _, events, _ in runs)
    for op in expected[:taken]:
        assert isinstance(op, Pub)
        assert not op.reply
        assert op.subject in known
        assert op.headers is None or headers
    assert bytes(out) == b"".join(
        event_of(op.subject, 7 + i, 9, op.payload, op.headers)
        for i, op in enumerate(expected[:taken])
        if isinstance(op, Pub)
    )
    assert python_reads(stream[end:], []) == (expected[taken:], error)


def runs_of(subjects_: list[str]) -> list[tuple[str, list[str]]]:
    grouped: list[tuple[str, list[str]]] = []
    for subject in subjects_:
        if grouped and grouped[-1][0] == subject:
            grouped[-1][1].append(subject)
        else:
            grouped.append((subject, [subject]))
    return grouped


def test_route_pubs_leaves_replies_and_unannounced_headers_to_python() -> None:
    """A reply subject is checked in Python (a service import's request, a 503 when none responds);
    an HPUB from a client that did not say ``headers`` in its CONNECT is refused there."""
    assert native_route_pubs is not None
    buffer = bytearray()
    table = {b"a": (None, b"vpn.a", (buffer,))}
    hpub = b"HPUB a 12 12\r\nNATS/1.0\r\n\r\n\r\n"
    cases = [
        (b"PUB a r 1\r\nx\r\n", True),
        (b"HPUB a r 12 12\r\nNATS/1.0\r\n\r\n\r\n", True),
        (hpub, False),
        (b"PUB a 2\r\nx\r\n", True),
    ]
    for stream, headers in cases:
        runs: list[tuple[Any, int, int]] = []
        assert (
            native_route_pubs(
                stream, 0, 1024, MAX_CONTROL_LINE, table, RAW_SOURCE, 1, 1, 1 << 20, runs, headers
            )
            == 0
        )
        assert runs == []
        assert buffer == b""
    runs = []
    end = native_route_pubs(hpub, 0, 1024, MAX_CONTROL_LINE, table, RAW_SOURCE, 1, 1, 1 << 20, runs, True)
    assert end == len(hpub)
    assert bytes(buffer) == event_of("a", 1, 1, b"", b"NATS/1.0\r\n\r\n")
