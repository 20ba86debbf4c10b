"""Guaranteed events on their way to another node: one spool per destination node (seed 002: kept on
the neighbour while the destination is down, delivered when it returns).

A spool is a streams partition log of EVENT frames. ``acked`` is the first offset the destination has
not confirmed; ``sent`` the first not yet sent on the current connection; ``durable`` the first not yet
known to be on disk (as ``--fsync`` says) and on the HA standby. Nothing at or past ``durable`` is sent:
a copy that reached the destination first would make it drop, as a resend, whatever event a
restarted node or its standby later stores at the same offset. A link that goes down
rewinds ``sent`` to ``acked``: what was unconfirmed goes again, and the destination's dedup by event
id drops what it had stored already. ``acked`` is kept in a small file next to the log (a stale one
only resends, never loses; synced at each save unless ``--fsync never``); segments below it are
deleted.

Offsets never start over for a destination: a new spool (a first event for that node, or one after
``mesh forget``, or a data directory replaced) starts at the clock in microseconds, above every offset
an earlier spool used (unless it took more than a million events a second), since the destination
drops as a resend anything at or below the last offset it stored from this node.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshplane.core.mesh.frames import Frame, FrameType, decode_spooled
from meshplane.core.mesh.spool_shares import SpoolShares
from meshplane.core.mesh.vpn import DEFAULT, vpn_of
from meshplane.core.streamlog import Record
from meshplane.streams.errors import CorruptRecords, StorageError
from meshplane.streams.files import FilePool, write_atomic
from meshplane.streams.log import PartitionLog
from meshplane.streams.segments import segment_name

log = logging.getLogger(__name__)

ACKED_FILE = "acked"
SYNCED_ACKED_FILE = "acked.synced"  # written by earlier versions: still read
READ_BYTES = 256 * 1024  # read from a spool at a time


class SpoolFull(Exception):
    """A guaranteed publish refused: a destination's spool is at its limit (the publisher is told)."""


@dataclass(frozen=True)
class SpoolLimits:
    max_bytes: int = 1 << 30  # per destination
    max_events: int = 1_000_000  # per destination
    window: int = 10_000  # sent but not yet confirmed, at most
    segment_bytes: int = 16 * 1024 * 1024
    sync_acked: bool = True  # fsync the confirmed offset at each save (False: --fsync never)


class Spool:
    """The guaranteed events one destination node has not confirmed yet."""

    def __init__(
        self, directory: Path, peer: str, limits: SpoolLimits, files: FilePool, first_offset: int = 0
    ) -> None:
        """``first_offset``: where a spool that holds nothing yet starts (:func:`new_spool_offset`)."""
        self.directory = directory
        self.peer = peer
        self.limits = limits
        if first_offset and not any(directory.glob("*.log")):
            directory.mkdir(parents=True, exist_ok=True)
            (directory / segment_name(first_offset)).touch()
        self.log = PartitionLog(directory, segment_bytes=limits.segment_bytes, files=files)
        self.acked = min(max(self._read_acked(), self.log.start_offset), self.log.next_offset)
        self.sent = self.acked
        self.durable = self.log.next_offset  # what a node (re)starting with finds is what it has ...
        if limits.sync_acked and self.log.next_offset > self.acked:
            try:  # ... once on disk: a killed node's appends may be in the page cache only
                self.log.sync()
            except OSError as exc:
                self.durable = self.acked  # sent once a later commit is on disk
                log.error("spool for %s: cannot fsync what it holds (%s)", peer, exc)
        self.refused = 0  # publishes refused because this spool was full
        self._saved = self.acked
        self.shares = SpoolShares(self.acked)  # each VPN's bytes here (its max_spool_bytes)
        self._count_shares()

    def _count_shares(self) -> None:
        """What the spool holds unconfirmed, by VPN (read once at start: bounded by the spool's limits)."""
        offset = self.acked
        while offset < self.log.next_offset:
            try:
                records = self.log.read(offset, 1024, READ_BYTES)
            except (OSError, StorageError, CorruptRecords) as exc:  # sent (or not) as ever, uncounted
                log.warning("spool for %s: cannot count its VPNs' bytes (%s)", self.peer, exc)
                return
            if not records:
                return
            self.shares.added(
                records[0].offset, [_vpn_of(r.payload) for r in records], [len(r.payload) for r in records]
            )
            offset = records[-1].offset + 1

    def _read_acked(self) -> int:
        """The confirmed offset saved last (if a power loss lost it, what is kept is sent again and
        the destination drops what it stored already)."""
        return max(self._read(ACKED_FILE), self._read(SYNCED_ACKED_FILE))

    def _read(self, name: str) -> int:
        try:
            return int((self.directory / name).read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    @property
    def pending(self) -> int:
        """Events stored here and not yet confirmed by the destination."""
        return self.log.next_offset - self.acked

    def room(self) -> list[int]:
        """[events, bytes] this spool may still take (a batch counts them down as it fills it)."""
        return [self.limits.max_events - self.pending, self.limits.max_bytes - self.log.size_bytes]

    def refuse(self) -> SpoolFull:
        """An event that does not fit: counted, and why."""
        self.refused += 1
        return SpoolFull(
            f"the spool for node {self.peer!r} is full ({self.pending} events, "
            f"{self.log.size_bytes} bytes; limits {self.limits.max_events} events, "
            f"{self.limits.max_bytes} bytes): the node has been unreachable too long"
        )

    def append(self, frames: list[bytes], vpns: list[str] | None = None) -> int:
        """Store EVENT frames (each of its VPN in ``vpns``); the offset of the first. Raises
        StorageError (nothing stored) on a failed write."""
        first = self.log.append(frames, time.time_ns() // 1_000_000)
        self.shares.added(first, vpns or [DEFAULT] * len(frames), [len(frame) for frame in frames])
        return first

    def to_send(self) -> list[Record]:
        """The next stored events not sent yet, within the window of unconfirmed ones."""
        room = min(self.limits.window - (self.sent - self.acked), self.durable - self.sent)
        if room <= 0:
            return []
        return self.log.read(self.sent, min(room, 1024), READ_BYTES)

    def confirm(self, offset: int) -> bool:
        """The destination stored everything up to ``offset``. True if that is news."""
        if offset + 1 <= self.acked or offset >= self.log.next_offset:
            return False
        self.acked = offset + 1
        self.sent = max(self.sent, self.acked)
        self.shares.confirmed(self.acked)
        return True

    def rewind(self) -> None:
        self.sent = self.acked

    def save(self) -> None:
        """Remember ``acked`` and drop the segments below it (a stale one means resending, which the
        destination drops as duplicates)."""
        if self.acked == self._saved:
            return
        try:
            write_atomic(self.directory / ACKED_FILE, str(self.acked).encode(), sync=self.limits.sync_acked)
            self._saved = self.acked
            self.log.apply_retention(time.time_ns() // 1_000_000, keep_from=self.acked)
        except (OSError, StorageError) as exc:
            log.warning("spool for %s: could not save its confirmed offset (%s)", self.peer, exc)

    def close(self) -> None:
        with contextlib.suppress(OSError, StorageError):
            self.save()
        self.log.close()


def _vpn_of(raw: bytes) -> str:
    """The VPN of a stored EVENT frame (a damaged one counts as the default VPN's)."""
    try:
        return vpn_of(decode_spooled(Frame(FrameType.SPOOLED, 0, "", "", 0, raw)).subject)
    except ValueError:
        return DEFAULT


def new_spool_offset() -> int:
    """Where a new spool starts: the clock in microseconds (above what an earlier one used)."""
    return time.time_ns() // 1000


def spool_directory(root: Path, peer: str) -> Path:
    """Node ids are any printable text: the directory is named by the id's bytes in hex."""
    return root / peer.encode().hex()


def spool_peer(directory: Path) -> str | None:
    try:
        return bytes.fromhex(directory.name).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def spool_table(spools: Iterable[Spool]) -> list[dict[str, Any]]:
    """Each spool's counters, by peer (``GET /mesh``)."""
    return [
        {
            "peer": s.peer,
            "pending": s.pending,
            "bytes": s.log.size_bytes,
            "acked": s.acked,
            "sent": s.sent,
            "refused": s.refused,
        }
        for s in sorted(spools, key=lambda s: s.peer)
    ]
