"""A link's session records (issue 54): what one side seals only the other side of the same handshake
opens, in order, whatever the socket cuts it into; anything else is refused."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.mesh.frames import HANDSHAKE_FRAME_BYTES, Frame, FrameType, encode_frame
from meshplane.core.mesh.handshake import NONCE_BYTES
from meshplane.mesh.connection import FrameConnection
from meshplane.mesh.session import RECORD_BYTES, SessionError, SessionKeys, session_keys
from tests.support.transport import RecordingTransport

FIELDS: dict[str, Any] = {
    "dialler_nonce": b"d" * NONCE_BYTES,
    "node_nonce": b"n" * NONCE_BYTES,
    "role": "route",
    "dialler_id": "a",
    "node_id": "b",
}


def keys(**changes: Any) -> SessionKeys:
    return session_keys(b"secret", **{**FIELDS, **changes})


@given(
    chunks=st.lists(st.binary(max_size=3 * RECORD_BYTES // 2), max_size=5),
    cuts=st.lists(st.integers(min_value=1, max_value=70_000), min_size=1, max_size=20),
)
def test_what_is_sealed_opens_in_order_however_it_is_cut(chunks: list[bytes], cuts: list[int]) -> None:
    sealer, opener = keys().sealer(True), keys().opener(False)
    stream = b"".join(sealer.seal(chunk) for chunk in chunks)
    out, start, index = [], 0, 0
    while start < len(stream):
        size = cuts[index % len(cuts)]
        out.append(opener.feed(stream[start : start + size]))
        start, index = start + size, index + 1
    assert b"".join(out) == b"".join(chunks)
    assert opener.pending == 0


@pytest.mark.parametrize(
    "other",
    [
        {"secret": b"another secret"},
        {"dialler_nonce": b"x" * NONCE_BYTES},
        {"node_nonce": b"x" * NONCE_BYTES},
        {"role": "client"},
        {"dialler_id": "c"},
        {"node_id": "c"},
    ],
)
def test_a_record_opens_only_with_the_keys_of_its_own_handshake(other: dict[str, Any]) -> None:
    secret = other.pop("secret", b"secret")
    sealed = keys().sealer(True).seal(b"frames")
    with pytest.raises(SessionError):
        session_keys(secret, **{**FIELDS, **other}).opener(False).feed(sealed)


def test_a_record_sent_back_replayed_reordered_or_forged_does_not_open() -> None:
    sealer = keys().sealer(True)
    first, second = sealer.seal(b"one"), sealer.seal(b"two")
    with pytest.raises(SessionError):  # reflected to its sender
        keys().opener(True).feed(first)
    for stream in (first + first, second + first, first[:-1] + bytes([first[-1] ^ 1])):
        with pytest.raises(SessionError):
            keys().opener(False).feed(stream)
    with pytest.raises(SessionError, match="bytes"):  # a length no sealer makes: refused at once
        keys().opener(False).feed(b"\xff\xff\xff\xff")


def test_an_empty_record_confirms_the_keys() -> None:
    opener = keys().opener(False)
    assert opener.feed(keys().sealer(True).seal(b"")) == b""
    assert opener.opened == 1


async def test_a_connection_reads_handshake_frames_then_only_sealed_records() -> None:
    frames: list[Frame] = []
    confirmed: list[FrameConnection] = []
    limits: list[str] = []

    def on_frame(conn: FrameConnection, frame: Frame) -> None:
        frames.append(frame)
        if frame.type is FrameType.AUTH:
            conn.seal(keys(), dialler=False, on_confirmed=confirmed.append)

    conn = FrameConnection(
        max_payload=1000,
        batch_size=10,
        batch_timeout_ms=0,
        on_frame=on_frame,
        on_bad=lambda c, e: None,
        on_close=lambda c: None,
        on_limit=lambda c, reason: limits.append(reason),
    )
    transport = RecordingTransport()
    conn.connection_made(transport)
    sealer = keys().sealer(True)
    hello, auth = encode_frame(FrameType.HELLO, "a"), encode_frame(FrameType.AUTH, "a")
    event = encode_frame(FrameType.EVENT, "a", "s", 1, b"\x00" * 8)
    conn.data_received(hello + auth + sealer.seal(b"") + sealer.seal(event))
    assert [f.type for f in frames] == [FrameType.HELLO, FrameType.AUTH, FrameType.EVENT]
    assert confirmed == [conn]
    conn.data_received(event)  # a frame in clear after the handshake: the connection is lost
    assert limits == ["bad_record"]
    assert len(frames) == 3
    conn.send(event)
    await asyncio.sleep(0)
    assert transport.writes == []  # closed: nothing more goes out


@pytest.mark.parametrize(
    ("first", "reason"),
    [
        (encode_frame(FrameType.EVENT, "a", "s", 1, b"\x00" * 8), "before_auth"),
        (encode_frame(FrameType.HELLO, "a", payload=b"x" * HANDSHAKE_FRAME_BYTES)[:40], "hello_too_large"),
    ],
)
async def test_before_its_proof_a_connection_takes_small_handshake_frames_only(
    first: bytes, reason: str
) -> None:
    limits: list[str] = []
    seen: list[Frame] = []
    conn = FrameConnection(
        max_payload=10_000_000,
        batch_size=10,
        batch_timeout_ms=0,
        on_frame=lambda c, f: seen.append(f),
        on_bad=lambda c, e: None,
        on_close=lambda c: None,
        on_limit=lambda c, r: limits.append(r),
    )
    conn.connection_made(RecordingTransport())
    conn.data_received(first)
    assert limits == [reason]
    assert seen == []


async def test_a_record_begun_must_be_finished_within_the_frame_timeout() -> None:
    limits: list[str] = []
    conn = FrameConnection(
        max_payload=1000,
        batch_size=10,
        batch_timeout_ms=0,
        on_frame=lambda c, f: None,
        on_bad=lambda c, e: None,
        on_close=lambda c: None,
        on_limit=lambda c, r: limits.append(r),
    )
    conn.connection_made(RecordingTransport())
    conn.seal(keys(), dialler=False)
    conn.data_received(keys().sealer(True).seal(b"x" * 1000)[:500])  # half a record, no frame yet
    assert conn.partial_since is not None
    conn.check_deadlines(conn.partial_since + 11, frame_timeout=10, idle_timeout=0)
    assert limits == ["slow_frame"]
