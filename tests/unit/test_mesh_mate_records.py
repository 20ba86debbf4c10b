"""HA mates' etcd records (issue 54): signed with the members' secret, bound to their key; anything
else is not believed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.mesh.mate_records import (
    Unreadable,
    decode_active,
    decode_current,
    encode_active,
    encode_current,
)

ACTIVE, CURRENT = b"meshplane/mates/c/a/active", b"meshplane/mates/c/a/current"


@given(token=st.text(max_size=40), route=st.text(max_size=60), secret=st.text(max_size=20))
def test_what_a_mate_writes_it_reads_back(token: str, route: str, secret: str) -> None:
    record = decode_active(secret, ACTIVE, encode_active(secret, ACTIVE, token, route))
    assert (record.token, record.route) == (token, route)


@given(tokens=st.lists(st.text(min_size=1, max_size=20), max_size=3))
def test_current_records_read_back(tokens: list[str]) -> None:
    assert decode_current("s", CURRENT, encode_current("s", CURRENT, tokens)) == tokens


def test_a_record_signed_otherwise_moved_or_altered_is_refused() -> None:
    signed = encode_active("members", ACTIVE, "t1", "tcp://10.0.0.1:16500")
    for secret, key, value in (
        ("clients", ACTIVE, signed),  # checked with another secret
        ("members", b"meshplane/mates/c/b/active", signed),  # another node's key
        ("members", ACTIVE, signed.replace(b"10.0.0.1", b"10.6.6.6")),  # its address changed
        ("members", ACTIVE, encode_active("", ACTIVE, "t1", "tcp://10.6.6.6:1")),  # no MAC at all
    ):
        with pytest.raises(ValueError, match="MAC"):
            decode_active(secret, key, value)
    with pytest.raises(ValueError, match="MAC"):
        decode_current("members", CURRENT, encode_current("members", ACTIVE, ["t1"]))


def test_an_earlier_releases_records_are_read_only_without_a_secret() -> None:
    assert decode_active("", ACTIVE, b'{"token": "t", "route": "r"}').route == "r"
    assert decode_current("", CURRENT, b'["t1", "t2"]') == ["t1", "t2"]
    with pytest.raises(ValueError, match="no MAC"):
        decode_current("members", CURRENT, b'["t1"]')


@pytest.mark.parametrize("value", [b"", b"garbage", b'{"route": "r"}', b"[1, 2]"])
def test_anything_else_is_unreadable(value: bytes) -> None:
    with pytest.raises(Unreadable):
        decode_active("members", ACTIVE, value)
