"""The JetStream backend's header parser gives what nats-py's own gives, for any bytes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client

from meshplane.streams.jetstream.client import StoreClient

PIECES = st.sampled_from(
    [b"Nats-Sequence", b"Meshplane-Ts", b": ", b":", b" ", b"\t", b"\r\n", b"\x1c", b"\xa0", b"\xc3\xa9",
     b"\xff", b"42", b"a b", b"\x0b", b"\x85"]
)  # fmt: skip


@given(st.lists(PIECES, max_size=24).map(b"".join))
def test_the_parser_agrees_with_nats_py(raw: bytes) -> None:
    assert StoreClient()._parse_header_lines(raw) == Client()._parse_header_lines(raw)


@given(st.binary(max_size=200))
def test_the_parser_agrees_with_nats_py_on_any_bytes(raw: bytes) -> None:
    assert StoreClient()._parse_header_lines(raw) == Client()._parse_header_lines(raw)


def test_what_jetstream_sends_is_parsed() -> None:
    raw = b"Nats-Stream: S\r\nNats-Sequence: 5\r\nMeshplane-Ts: 1700000000000\r\n\r\n"
    parsed = StoreClient()._parse_header_lines(raw)
    assert parsed == {"Nats-Stream": "S", "Nats-Sequence": "5", "Meshplane-Ts": "1700000000000"}
