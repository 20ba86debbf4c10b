"""A token bucket: a rate with a burst, for a Message VPN's publish limits (events and bytes per
second on one node). Pure: the caller passes the time.

``rate`` tokens are added per second, up to ``burst`` (so after a pause at most ``burst`` may go at
once); :meth:`TokenBucket.take` spends ``n`` tokens if they are there and says whether it did. A
refused take spends nothing: what is refused does not count against what follows.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenBucket:
    rate: float  # tokens per second, > 0
    burst: float  # tokens saved at most, > 0
    tokens: float = -1.0  # now (-1: full, at the first take)
    at: float = 0.0  # when ``tokens`` was last brought up to date

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst <= 0:
            raise ValueError("a rate and a burst above 0")

    def take(self, n: float, now: float) -> bool:
        """Spend ``n`` tokens at time ``now`` (seconds, monotonic) if there are that many."""
        if self.tokens < 0:
            self.tokens = self.burst
        elif now > self.at:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = max(self.at, now)
        if n > self.tokens + 1e-9:  # not refused by a rounding of the refill
            return False
        self.tokens -= n
        return True
