"""Where `meshplane topic consume -o ...` starts in a partition. Pure."""

from __future__ import annotations

import pytest

from meshplane.cli.consume import start_offset
from meshplane.cli.errors import CliError


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("beginning", 10),
        ("end", 50),
        ("-5", 45),
        ("-100", 10),  # no further back than the oldest kept
        ("20", 20),
        ("3", 10),  # deleted by retention: the oldest kept
        ("99", 50),  # past the end: the end
        ("s@1000", 33),
    ],
)
def test_start_offsets(spec: str, expected: int) -> None:
    assert start_offset(spec, 10, 50, 33) == expected


def test_a_time_with_nothing_after_it_starts_at_the_end_and_garbage_is_refused() -> None:
    assert start_offset("s@1000", 10, 50, None) == 50
    with pytest.raises(CliError, match="use beginning, end, N, -N or s@MILLISECONDS"):
        start_offset("middle", 10, 50, None)
