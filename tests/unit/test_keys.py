"""Event keys in JSON (core.keys) and in the log (core.streamlog): any bytes, one stored form each."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.keys import key_from_json, key_to_json, stored_key
from meshplane.core.metadata import MetadataError
from meshplane.core.streamlog import StoredEvent, decode_event, encode_event


@given(st.binary(max_size=64) | st.text(max_size=32).map(str.encode))
def test_any_bytes_go_through_json_and_the_log_and_come_back_the_same(raw: bytes) -> None:
    key = stored_key(raw)
    assert (key if isinstance(key, bytes) else key.encode()) == raw
    assert isinstance(key, bytes) == (raw.decode(errors="replace").encode() != raw)  # bytes only if not UTF-8
    shown = key_to_json(key)
    assert (shown["key"] is None) == isinstance(key, bytes)  # a client reading only `key` sees no key
    assert key_from_json(shown) == key
    back = decode_event(encode_event(StoredEvent("i", "e", 1, key)))
    assert (type(back.key), back.key) == (type(key), key)  # msgpack keeps str and bin apart


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"key": "a", "key_base64": "YQ=="}, "both given"),
        ({"key_base64": "YQ="}, "not base64"),
        ({"key_base64": 5}, "not base64"),
        ({"key": b"a"}, "must be a string"),
        ({"key": 3}, "must be a string"),
    ],
)
def test_a_key_that_is_not_text_or_base64_is_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(MetadataError, match=message):
        key_from_json(fields)


def test_a_stored_key_of_another_type_is_refused_on_decode() -> None:
    payload = msgspec.msgpack.encode(["i", "e", 1, 42])  # not written by meshplane
    with pytest.raises(msgspec.DecodeError, match="text or bytes, not int"):
        decode_event(payload)
