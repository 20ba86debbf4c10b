"""The streams API's field readers: null for an optional field is as if it were left out (a fuzzed
`{"limit": null}` reached the engine as None: a 500), and a required field is never null."""

from __future__ import annotations

import pytest

from meshplane.streams.errors import BadRequest
from meshplane.streams.http.params import get_int, get_str


def test_null_for_an_optional_field_takes_its_default() -> None:
    assert get_int({"limit": None}, "limit", 100) == 100
    assert get_int({"limit": None}, "limit", None) is None
    assert get_str({"strategy": None}, "strategy", "round_robin") == "round_robin"


def test_null_for_a_required_field_is_bad_input() -> None:
    with pytest.raises(BadRequest, match="not null"):
        get_int({"from_offset": None}, "from_offset")
    with pytest.raises(BadRequest, match="must be a string"):
        get_str({"topic": None}, "topic")
