"""A data directory and its copy on an HA mate (:mod:`meshplane.core.mirror`): the changes of the
paths the storage reports as changed (:func:`meshplane.streams.files.changed`), and their application
on the mate's side. The network between them is :mod:`meshplane.mesh.mates`."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from meshplane.core.mirror import (
    LOCK_NAMES,
    MAX_PUT_BYTES,
    Change,
    Put,
    Remove,
    Reset,
    SentFiles,
    checked_path,
    puts,
)
from meshplane.streams.files import unwatch_changes, watch_changes, write_atomic

TEMPORARY_SUFFIX = ".tmp"  # write_atomic's temporary files: never seen between two steps of the loop


class DirectorySource:
    """The active's side: which paths changed since the last call, as changes for the mate."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.sent = SentFiles()
        self.dirty: set[str] = set()
        self.removals: list[str] = []
        self.synced: set[str] = set()  # files last replaced whole and fsynced
        self.max_dirty = 100_000  # beyond this, the next changes re-read the whole directory
        self.on_change: Callable[[], None] | None = None  # told of the first change after each round
        watch_changes(self._changed)

    def close(self) -> None:
        unwatch_changes(self._changed)

    def _changed(self, path: Path, cut: int | None, synced: bool) -> None:
        try:
            relative = path.resolve().relative_to(self.root).as_posix()
        except ValueError:
            return  # another directory (tests run several servers in one process)
        if not self.dirty and self.on_change is not None:
            self.on_change()
        if len(self.dirty) >= self.max_dirty:
            self.dirty = {"."}
        self.dirty.add(relative)
        if synced:
            self.synced.add(relative)
        elif cut == 0:
            self.synced.discard(relative)
        if cut is not None:
            self.sent.cut(relative, cut)
        elif not os.path.lexists(path) and self.sent.removed(relative):
            # Gone now: removed on the mate before anything made later under the same name (which may
            # even get the same inode number back).
            self.removals.append(relative)

    def snapshot(self) -> Iterator[Change]:
        """Everything, from an empty copy: Reset, then every file."""
        self.sent.clear()
        self.dirty.clear()
        self.removals.clear()
        yield Reset()
        yield from self._reconcile(".")

    def changes(self) -> Iterator[Change]:
        """What changed since the last call (or the snapshot), in the order the paths were marked."""
        dirty, self.dirty = self.dirty, set()
        removals, self.removals = self.removals, []
        yield from (Remove(path) for path in removals)
        if "." in dirty:
            dirty = {"."}
        for relative in sorted(dirty, key=lambda p: p.count("/")):
            yield from self._reconcile(relative)

    def _reconcile(self, relative: str) -> Iterator[Change]:
        path = self.root / relative
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            if self.sent.removed(relative):
                yield Remove(relative)
            return
        if stat.S_ISDIR(info.st_mode):
            yield from self._reconcile_directory(relative, path)
        elif stat.S_ISREG(info.st_mode) and _mirrored(relative):
            yield from self._send_file(relative, path, info)

    def _reconcile_directory(self, relative: str, path: Path) -> Iterator[Change]:
        present: set[str] = set()
        try:
            with os.scandir(path) as entries:
                names = [entry.name for entry in entries]
        except (FileNotFoundError, NotADirectoryError):  # removed since the stat
            names = []
        for name in names:
            child = name if relative == "." else f"{relative}/{name}"
            if _mirrored(child):
                present.add(child)
                yield from self._reconcile(child)
        depth = 0 if relative == "." else relative.count("/") + 1
        gone = {"/".join(name.split("/")[: depth + 1]) for name in self.sent.under(relative)} - present
        for child in sorted(gone):
            self.sent.removed(child)
            yield Remove(child)

    def _send_file(self, relative: str, path: Path, info: os.stat_result) -> Iterator[Change]:
        delta = self.sent.delta(relative, info.st_ino, info.st_size)
        if delta is None:
            return
        start, end = delta
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # removed since the stat: the directory's change says so
            return
        try:
            at = start
            while at < end or at == start:
                data = os.pread(fd, min(MAX_PUT_BYTES, end - at), at)
                yield from puts(relative, at, data, relative in self.synced)
                if not data:
                    break
                at += len(data)
        finally:
            os.close(fd)
        self.sent.record(relative, info.st_ino, at)


def _mirrored(relative: str) -> bool:
    return relative.split("/", 1)[0] not in LOCK_NAMES and not relative.endswith(TEMPORARY_SUFFIX)


class DirectoryReplica:
    """The standby's side: applies changes to its own copy. Paths are checked (a mate is trusted with
    the data, not with paths outside the directory)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.bytes = 0  # file bytes applied (said when the standby takes over)
        self._touched: set[Path] = set()  # files and directories changed since the last sync

    def apply(self, change: Change) -> None:
        if isinstance(change, Put):
            self._put(self.root / checked_path(change.path), change.offset, change.data, change.sync)
        elif isinstance(change, Remove):
            self._remove(self.root / checked_path(change.path))
        elif isinstance(change, Reset):
            for entry in list(self.root.iterdir()):
                if entry.name not in LOCK_NAMES:
                    self._remove(entry)

    def sync(self) -> None:
        """fsync what changed since the last call (files, then the directories that hold them)."""
        touched, self._touched = self._touched, set()
        for path in sorted(touched, key=lambda p: -len(p.parts)):
            with contextlib.suppress(FileNotFoundError):
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

    def _put(self, path: Path, offset: int, data: bytes, sync: bool) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._touched.update((path, path.parent))
        self.bytes += len(data)
        if offset == 0 and len(data) < MAX_PUT_BYTES:  # a whole small file: replaced whole, as there
            write_atomic(path, data, sync=sync)
            return
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            at = offset
            while view:
                written = os.pwrite(fd, view, at)
                view, at = view[written:], at + written
            os.ftruncate(fd, offset + len(data))
        finally:
            os.close(fd)

    def _remove(self, path: Path) -> None:
        self._touched.add(path.parent)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
