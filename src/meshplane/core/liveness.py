"""Publisher liveness, Tango-style: every sign of life resets a deadline; a missed deadline is a timeout.

Pure and clock-injected: the caller says what time it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplane.core.sequence import PUBLISHERS_REMEMBERED


@dataclass(frozen=True, slots=True)
class EventTimeout:
    """No event or heartbeat from ``publisher_id`` for ``silent_for`` seconds."""

    publisher_id: int
    silent_for: float


@dataclass(frozen=True, slots=True)
class PublisherRecovered:
    """``publisher_id`` spoke again after a timeout."""

    publisher_id: int
    silent_for: float


class LivenessTracker:
    """Tracks the last sign of life of every publisher; a publisher silent for ``timeout`` has timed out.

    At most ``remembered`` publishers, as the sequence tracker keeps: the one heard of least recently
    is forgotten first (``forgotten`` counts them), so a spray of made-up ids costs a bounded table.
    """

    def __init__(self, timeout: float, remembered: int = PUBLISHERS_REMEMBERED) -> None:
        self.timeout = timeout
        self.remembered = remembered
        self._last_seen: dict[int, float] = {}  # least recently seen first
        self._timed_out: dict[int, float] = {}  # publisher -> when it was last seen before timing out
        self.timeouts = 0
        self.recoveries = 0
        self.forgotten = 0

    def seen(self, publisher_id: int, now: float) -> PublisherRecovered | None:
        """Record a sign of life; returns a recovery notice when the publisher had timed out."""
        last_seen = self._last_seen
        if last_seen.pop(publisher_id, None) is None and len(last_seen) >= self.remembered:
            oldest = next(iter(last_seen))
            del last_seen[oldest]
            self._timed_out.pop(oldest, None)
            self.forgotten += 1
        last_seen[publisher_id] = now
        last = self._timed_out.pop(publisher_id, None)
        if last is None:
            return None
        self.recoveries += 1
        return PublisherRecovered(publisher_id, now - last)

    def silent(self, now: float) -> list[int]:
        """Publishers past their deadline and not yet reported (what :meth:`check` would report)."""
        return [
            pid
            for pid, last in self._last_seen.items()
            if now - last > self.timeout and pid not in self._timed_out
        ]

    def check(self, now: float) -> list[EventTimeout]:
        """Publishers whose deadline passed since the last check (each reported once per silence)."""
        expired = [EventTimeout(pid, now - self._last_seen[pid]) for pid in self.silent(now)]
        for notice in expired:
            self._timed_out[notice.publisher_id] = now - notice.silent_for
        self.timeouts += len(expired)
        return expired

    def forget(self, publisher_id: int) -> None:
        """The publisher left (its record is gone): stop expecting it."""
        self._last_seen.pop(publisher_id, None)
        self._timed_out.pop(publisher_id, None)

    def is_timed_out(self, publisher_id: int) -> bool:
        return publisher_id in self._timed_out

    @property
    def timed_out(self) -> list[int]:
        return list(self._timed_out)

    @property
    def tracked(self) -> int:
        return len(self._last_seen)
