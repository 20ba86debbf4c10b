"""A reviewer's attack: the mates' ``current`` record signed its list joined with NUL, so
["mate-1", "mate-2"] could be rewritten as ["mate-1\x00mate-2"] under the same MAC (naming no mate,
so none could take over). Each part is now signed with its length."""

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
