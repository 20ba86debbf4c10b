"""Types of the C extension ``_records.c`` (see there and ``streamlog``)."""

from typing import Any

def scan(
    data: bytes,
    pos: int,
    expected_offset: int | None,
    remaining: int,
    start_position: int,
    record_class: type[Any],
    out: list[Any],
    /,
) -> tuple[int, int | None, int]: ...
def encode(offset: int, timestamp_ms: int, payload: bytes, /) -> bytes | None: ...
