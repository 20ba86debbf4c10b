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


async def test_a_range_deleted_while_following_is_skipped_and_said(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from typing import Any

    from meshplane.cli.consume import _Printer, _read_from
    from meshplane.streams.errors import OffsetOutOfRange

    class Partition:  # the server's answers for one partition whose retention moved on
        async def consume_partition(
            self, topic: str, partition: int, offset: int, limit: int
        ) -> dict[str, Any]:
            if offset < 40:
                raise OffsetOutOfRange(offset, 40, 41)
            events = [{"offset": o, "data": o} for o in range(offset, 42)]
            return {"events": events, "next_offset": 42}

    printer = _Printer(0)
    await _read_from(Partition(), "t", {0: 12}, printer, exit_at_end=True)  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    assert [line.split('"offset": ')[1].split(",")[0] for line in out.splitlines()] == ["40", "41"]
    assert "t/0: offsets 12..39 deleted by retention: skipped" in err
