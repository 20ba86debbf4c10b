"""ATTACK (reviewer's reproduction, failing on today's code): the mates' etcd records are MACed over
their fields joined with NUL (src/meshplane/core/mesh/mate_records.py, ``_mac``), an ambiguous encoding:
a party that can write etcd but holds no secret rewrites a signed ``current`` naming mates a and b as
one naming the mate "a\\x00b" (which nobody is: no mate may take over, a wedge until `mates reset`), and
the MAC still checks (a list of any length joined with NUL; ``active``'s two fields are safe)."""

from __future__ import annotations

import msgspec
import pytest

from meshplane.core.mesh.mate_records import (
    CurrentRecord,
    decode_current,
    encode_current,
)

SECRET = "members-secret-0123456789abcdef"
KEY = b"/meshplane/mates/c1/a/current"


def test_a_current_records_names_cannot_be_spliced_under_the_same_mac() -> None:
    signed = msgspec.json.decode(encode_current(SECRET, KEY, ["mate-1", "mate-2"]), type=CurrentRecord)
    spliced = msgspec.json.encode(CurrentRecord(["mate-1\x00mate-2"], signed.mac))
    with pytest.raises(ValueError, match="MAC"):
        decode_current(SECRET, KEY, spliced)
