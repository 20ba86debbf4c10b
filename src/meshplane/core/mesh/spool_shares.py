"""How many bytes of a spool each Message VPN's guaranteed events hold, sans I/O (by key: a VPN's
name, or ``VPN\0USER`` for what a user published on this node, :mod:`meshplane.mesh.vpn_spool_room`).

A spool (one destination node's or cluster's) is one log of every VPN's events; a VPN's
``max_spool_bytes`` bounds its share of what a node's spools hold unconfirmed, so one VPN whose
subscribers' node is down cannot fill the spools every VPN shares. Events are appended at consecutive
offsets and confirmed in order, so a spool keeps runs of consecutive events of one VPN, each with its
events' sizes (4 bytes an event); confirming releases them from the oldest, exactly.

Invariant: ``bytes[vpn]`` is the sum of the sizes of ``vpn``'s events at offsets from ``acked`` on.
"""

from __future__ import annotations

from array import array
from collections import Counter, deque
from dataclasses import dataclass, field

RUN_EVENTS = 4096  # events a run holds at most: a run's sizes stay one small array


@dataclass(slots=True)
class _Run:
    vpn: str
    first: int  # its first event's offset
    sizes: array[int]
    released: int = 0  # its first events already confirmed


@dataclass
class SpoolShares:
    acked: int = 0  # the first offset not confirmed
    bytes: Counter[str] = field(default_factory=Counter)  # by VPN: its events' bytes not confirmed
    _runs: deque[_Run] = field(default_factory=deque)

    def added(self, first: int, vpns: list[str], sizes: list[int]) -> None:
        """Events at offsets ``first``, ``first + 1``, ... (after the last added) are of ``vpns``, of
        ``sizes`` bytes. A batch is mostly one VPN's: a run is taken whole, not event by event."""
        at, end = 0, len(vpns)
        if end and vpns.count(vpns[0]) == end and self._runs and self._runs[-1].vpn == vpns[0]:
            tail = self._runs[-1]  # the usual batch: one VPN's, after one of its own (counted in C)
            if len(tail.sizes) + end <= RUN_EVENTS:
                assert first == tail.first + len(tail.sizes), "events are added at consecutive offsets"
                tail.sizes.extend(sizes)
                self.bytes[tail.vpn] += sum(sizes)
                return
        while at < end:
            vpn = vpns[at]
            upto = at + 1
            while upto < end and vpns[upto] == vpn:
                upto += 1
            last = self._runs[-1] if self._runs else None
            if last is not None and last.vpn == vpn and len(last.sizes) < RUN_EVENTS:
                assert first + at == last.first + len(last.sizes), "events are added at consecutive offsets"
            else:
                last = _Run(vpn, first + at, array("I"))
                self._runs.append(last)
            upto = min(upto, at + RUN_EVENTS - len(last.sizes))
            taken = sizes[at:upto]
            last.sizes.extend(taken)
            self.bytes[vpn] += sum(taken)
            at = upto

    def confirmed(self, acked: int) -> None:
        """Everything below ``acked`` is confirmed (or gone): its bytes are released."""
        if acked <= self.acked:
            return
        self.acked = acked
        runs = self._runs
        while runs:
            run = runs[0]
            end = min(acked - run.first, len(run.sizes))
            if end <= run.released:
                return
            released = sum(run.sizes[run.released : end])
            run.released = end
            self.bytes[run.vpn] -= released
            if not self.bytes[run.vpn]:
                del self.bytes[run.vpn]
            if end < len(run.sizes):
                return
            runs.popleft()
