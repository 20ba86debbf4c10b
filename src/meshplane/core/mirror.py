"""A data directory mirrored on an HA mate, sans I/O: the changes the active sends, and what it has sent.

The active's data directory changes by appends, truncations, whole-file replacements and removals;
its mate (the standby, on another machine) keeps a copy that is current at every barrier:

- ``Put(path, offset, data)``: write ``data`` at ``offset`` and make the file end there (an append
  from the size last sent, a shorter file, or a replaced file sent whole from 0);
- ``Remove(path)``: the file, or the directory and everything under it, is gone;
- ``Reset()``: the mate empties its copy first (a new mirror starts from a snapshot);
- ``Barrier(number, sync)``: everything before it is applied (and with ``sync``, fsynced: the active
  runs with ``--fsync always``); the mate answers MIRROR_ACK ``number``.

What the active has sent is remembered per file as (inode, size): a file whose inode changed was
replaced (``os.replace``) and is sent whole, one that grew sends its tail, one that shrank is cut.
The data files are append-only or replaced whole; a truncation is reported with its size (a failed
append taken back; a replacement is a cut to 0, as the kernel may give the new file the inode number
of the old one), so bytes rewritten after it are sent again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath

import msgspec

from meshplane.core.mesh.frames import encode_payload, payload_decoder

MAX_PUT_BYTES = 1024 * 1024  # one Put carries at most this much (larger deltas are split)
LOCK_NAMES = frozenset({".lock", ".mate-id"})  # each mate's own: never mirrored


class Put(msgspec.Struct, tag=True, frozen=True):
    path: str
    offset: int
    data: bytes
    sync: bool = False  # a whole file the active fsynced when it replaced it: the mate does too


class Remove(msgspec.Struct, tag=True, frozen=True):
    path: str


class Reset(msgspec.Struct, tag=True, frozen=True):
    pass


class Barrier(msgspec.Struct, tag=True, frozen=True):
    number: int
    sync: bool = False


Change = Put | Remove | Reset | Barrier


class Changes(msgspec.Struct, frozen=True):
    """MIRROR's payload: changes in order."""

    changes: list[Change]


encode_changes = encode_payload
decode_changes = payload_decoder(Changes, "MIRROR")


def checked_path(text: str) -> PurePosixPath:
    """A path inside the data directory, or ValueError: relative, no ``..``, not a mate's own file."""
    parts = text.split("/")
    if any(part in ("", ".", "..") for part in parts) or "\x00" in text:
        raise ValueError(f"mirror path {text[:200]!r} is not inside the data directory")
    if parts[0] in LOCK_NAMES:
        raise ValueError(f"mirror path {text[:200]!r} names a mate's own file")
    return PurePosixPath(text)


@dataclass(frozen=True, slots=True)
class Sent:
    inode: int
    size: int
    cut: bool = False  # the file was truncated to ``size``: the mate's copy is cut there too


class SentFiles:
    """What the active has sent, per relative path: the base of the next delta of each file."""

    def __init__(self) -> None:
        self.files: dict[str, Sent] = {}

    def delta(self, path: str, inode: int, size: int) -> tuple[int, int] | None:
        """The byte range [start, end) of ``path`` to send now, or None if the mate has it all."""
        sent = self.files.get(path)
        if sent is None or sent.inode != inode:
            return (0, size)
        if sent.size == size and not sent.cut:
            return None
        return (min(sent.size, size), size)

    def cut(self, path: str, size: int) -> None:
        """The file was truncated to ``size``: what the mate has beyond it is resent."""
        sent = self.files.get(path)
        if sent is not None and size < sent.size:
            self.files[path] = Sent(sent.inode, size, cut=True)

    def record(self, path: str, inode: int, size: int) -> None:
        self.files[path] = Sent(inode, size)

    def removed(self, path: str) -> bool:
        """Forget ``path`` and everything under it; True if the mate had any of it."""
        prefix = path + "/"
        gone = [name for name in self.files if name == path or name.startswith(prefix)]
        for name in gone:
            del self.files[name]
        return bool(gone)

    def under(self, directory: str) -> Iterator[str]:
        prefix = "" if directory in ("", ".") else directory + "/"
        return (name for name in list(self.files) if name.startswith(prefix))

    def clear(self) -> None:
        self.files.clear()


def puts(path: str, start: int, data: bytes, sync: bool = False) -> list[Put]:
    """``data`` (the file's bytes from ``start``) as Puts of at most MAX_PUT_BYTES; at least one, so
    that a file cut shorter is cut on the mate too."""
    if not data or (start == 0 and len(data) < MAX_PUT_BYTES):
        return [Put(path, start, data, sync)]
    return [Put(path, start + at, data[at : at + MAX_PUT_BYTES]) for at in range(0, len(data), MAX_PUT_BYTES)]
