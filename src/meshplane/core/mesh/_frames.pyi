"""Types of the C extension ``_frames.c`` (see there and ``frames.py``)."""

from typing import Any

def read_frames(
    buffer: bytes,
    start: int,
    max_payload: int,
    max_subject: int,
    frame_class: type[Any],
    kinds: tuple[Any, ...],
    text: dict[bytes, str],
    out: list[Any],
    /,
) -> int: ...
def encode_frame(
    kind: int, flags: int, source: str, subject: str, sequence: int, payload: bytes, timestamp: int | None, /
) -> bytes | None: ...
def route_events(
    buffer: bytes,
    start: int,
    max_payload: int,
    max_subject: int,
    origin: bytes | None,
    text: dict[bytes, str],
    table: dict[bytes, tuple[Any, Any, tuple[bytearray | tuple[bytearray, bytes], ...]]],
    limit: int,
    peer: str | None,
    now: float,
    runs: list[tuple[Any, int, int]],
    /,
) -> int: ...

class DedupIds:
    """One topic's dedup ids in C (``dedup_ids.h``); ``dedup.PyIds`` is the reference."""

    bound: int
    def __init__(self, bound: int) -> None: ...
    def seen(self, key: tuple[int, int, str | None, str | None], now: float, /) -> bool: ...
    def expire(self, cutoff: float, /) -> None: ...
    def items(self) -> list[tuple[tuple[int, int, str | None, str | None], float]]: ...
    def __len__(self) -> int: ...
