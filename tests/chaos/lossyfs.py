"""A filesystem that loses what was not fsynced, as a machine's power loss does (LazyFS's idea, for
Jepsen): a FUSE passthrough to a backing directory that keeps each file's writes in memory until
that file is fsynced. Killing its process is the power cut: the backing directory then holds
exactly what was synced, and a fresh mount over it is the machine coming back.

What it models: file data is lost unless fsynced (fsync and fdatasync alike); metadata (create,
mkdir, rename, unlink, truncate, permissions) reaches the backing directory at once, as a journaled
filesystem's would soon after. So a file renamed into place before its data was synced comes back
empty or short, the classic bug. Writes a file has not fsynced are held up to ``MAX_UNSYNCED``
bytes in all; past that the file with the most goes to the backing directory (as a kernel's
writeback under memory pressure would), still unsynced there but no longer lost with the mount.

    python -m tests.chaos.lossyfs BACKING MOUNTPOINT      # foreground; SIGKILL it to cut the power
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_UNSYNCED = 512 << 20


@dataclass
class PendingFile:
    size: int  # the file's size as its readers see it
    writes: list[tuple[int, bytes]] = field(default_factory=list)  # in the order made

    @property
    def bytes(self) -> int:
        return sum(len(data) for _, data in self.writes)


class Unsynced:
    """Pure: the writes not yet fsynced, per path. The adapter reads the backing file and asks this
    what its readers see; fsync takes a file's writes to apply them to the backing file."""

    def __init__(self) -> None:
        self.files: dict[str, PendingFile] = {}
        self.total = 0

    def size(self, path: str, backing_size: int) -> int:
        pending = self.files.get(path)
        return backing_size if pending is None else pending.size

    def write(self, path: str, offset: int, data: bytes, backing_size: int) -> None:
        pending = self.files.setdefault(path, PendingFile(backing_size))
        pending.writes.append((offset, bytes(data)))
        pending.size = max(pending.size, offset + len(data))
        self.total += len(data)

    def read(self, path: str, offset: int, length: int, backing: bytes) -> bytes:
        """The bytes at ``offset`` (up to ``length``), given what the backing file holds there."""
        pending = self.files.get(path)
        if pending is None:
            return backing[:length]
        end = min(offset + length, pending.size)
        if end <= offset:
            return b""
        view = bytearray(backing[: end - offset].ljust(end - offset, b"\0"))
        for at, data in pending.writes:
            lo, hi = max(at, offset), min(at + len(data), end)
            if lo < hi:
                view[lo - offset : hi - offset] = data[lo - at : hi - at]
        return bytes(view)

    def take(self, path: str) -> PendingFile | None:
        """The file's writes, forgotten here (fsync, or writeback): the caller applies them."""
        pending = self.files.pop(path, None)
        if pending is not None:
            self.total -= pending.bytes
        return pending

    def truncate(self, path: str, length: int) -> None:
        """A truncate reached the backing file: writes past ``length`` are gone."""
        pending = self.files.get(path)
        if pending is None:
            return
        kept = [(at, data[: max(0, length - at)]) for at, data in pending.writes if at < length]
        self.total -= pending.bytes - sum(len(data) for _, data in kept)
        pending.writes, pending.size = kept, length

    def rename(self, old: str, new: str) -> None:
        self.take(new)
        pending = self.files.pop(old, None)
        if pending is not None:
            self.files[new] = pending

    def largest(self) -> str | None:
        return max(self.files, key=lambda path: self.files[path].bytes, default=None)


def apply(fd: int, pending: PendingFile) -> None:
    """``pending``'s writes onto the open backing file ``fd`` (its size included)."""
    for at, data in pending.writes:
        os.pwrite(fd, data, at)
    if os.fstat(fd).st_size < pending.size:
        os.ftruncate(fd, pending.size)


def operations(backing: str) -> Any:
    """The FUSE operations over ``backing`` (mfusepy's high-level API)."""
    import mfusepy  # type: ignore[import-untyped]  # the harness's only (and untyped)

    class LossyFS(mfusepy.Operations):  # type: ignore[misc]
        use_ns = True

        def __init__(self) -> None:
            self.unsynced = Unsynced()
            self.mutex = threading.Lock()  # not "lock": that is the POSIX-locks operation

        def real(self, path: str) -> str:
            return os.path.join(backing, path.lstrip("/"))

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            st = os.lstat(self.real(path))
            keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_atime_ns", "st_mtime_ns", "st_ctime_ns")
            attrs = {key.replace("_ns", ""): getattr(st, key) for key in keys}
            with self.mutex:
                attrs["st_size"] = self.unsynced.size(path, st.st_size)
            return attrs

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *os.listdir(self.real(path))]

        def statfs(self, path: str) -> dict[str, int]:
            st = os.statvfs(self.real(path))
            keys = (
                "f_bavail",
                "f_bfree",
                "f_blocks",
                "f_bsize",
                "f_favail",
                "f_ffree",
                "f_files",
                "f_frsize",
            )
            return {key: getattr(st, key) for key in keys} | {"f_namemax": st.f_namemax}

        def open(self, path: str, flags: int) -> int:
            # The kernel gives every write its offset (O_APPEND's too); pwrite on O_APPEND would ignore it.
            return os.open(
                self.real(path), flags & ~(os.O_ACCMODE | os.O_APPEND | os.O_TRUNC | os.O_CREAT) | os.O_RDWR
            )

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            return os.open(self.real(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            with self.mutex:
                return self.unsynced.read(path, offset, size, os.pread(fh, size, offset))

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            with self.mutex:
                self.unsynced.write(path, offset, data, os.fstat(fh).st_size)
                if self.unsynced.total > MAX_UNSYNCED:
                    self._write_back(self.unsynced.largest())
            return len(data)

        def _write_back(self, path: str | None) -> None:
            pending = self.unsynced.take(path) if path else None
            if path and pending:
                fd = os.open(self.real(path), os.O_RDWR)
                try:
                    apply(fd, pending)
                finally:
                    os.close(fd)

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            with self.mutex:
                pending = self.unsynced.take(path)
                if pending is not None:
                    apply(fh, pending)
            os.fsync(fh)
            return 0

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            with self.mutex:
                os.truncate(self.real(path), length)
                self.unsynced.truncate(path, length)
            return 0

        def release(self, path: str, fh: int) -> int:
            os.close(fh)
            return 0

        def unlink(self, path: str) -> int:
            with self.mutex:
                self.unsynced.take(path)
                os.unlink(self.real(path))
            return 0

        def rename(self, old: str, new: str) -> int:
            with self.mutex:
                os.rename(self.real(old), self.real(new))
                self.unsynced.rename(old, new)
            return 0

        def mkdir(self, path: str, mode: int) -> int:
            os.mkdir(self.real(path), mode)
            return 0

        def rmdir(self, path: str) -> int:
            os.rmdir(self.real(path))
            return 0

        def chmod(self, path: str, mode: int) -> int:
            os.chmod(self.real(path), mode)
            return 0

        def chown(self, path: str, uid: int, gid: int) -> int:
            os.chown(self.real(path), uid, gid)
            return 0

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            if times is None:
                os.utime(self.real(path))
            else:
                os.utime(self.real(path), ns=times)
            return 0

        def access(self, path: str, amode: int) -> int:
            if not os.access(self.real(path), amode):
                raise mfusepy.FuseOSError(errno.EACCES)
            return 0

    return LossyFS()


class Disk:
    """A lossy mount of ``backing`` at ``mountpoint``, in a process of its own; :meth:`cut` is the
    power loss (the process killed, the mount detached), :meth:`mount` the machine back."""

    def __init__(self, backing: Path, mountpoint: Path) -> None:
        self.backing, self.mountpoint = backing, mountpoint
        self.proc: subprocess.Popen[bytes] | None = None
        self.cut_exit: int | None = None  # how the process ended at the last cut (-9: power lost)
        backing.mkdir(parents=True, exist_ok=True)
        mountpoint.mkdir(parents=True, exist_ok=True)

    def mount(self, timeout: float = 10.0) -> Disk:
        log = open(self.backing.parent / f"{self.backing.name}.fuse.log", "ab")  # noqa: SIM115 - the child's
        command = [sys.executable, "-m", "tests.chaos.lossyfs", str(self.backing), str(self.mountpoint)]
        root = Path(__file__).resolve().parents[2]  # where ``tests`` is a package
        self.proc = subprocess.Popen(command, stdout=log, stderr=log, cwd=root, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while not os.path.ismount(self.mountpoint):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the lossy filesystem did not mount at {self.mountpoint}")
            time.sleep(0.02)
        return self

    def cut(self) -> None:
        """Power loss: what was not fsynced is gone; processes still using the mount get errors."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.cut_exit = self.proc.wait(10)
            self.proc = None
        subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True, timeout=10)

    def unmount(self) -> None:
        subprocess.run(["umount", str(self.mountpoint)], capture_output=True, timeout=10)
        self.cut()


def main() -> None:
    import mfusepy

    backing, mountpoint = sys.argv[1:3]
    mfusepy.FUSE(operations(backing), mountpoint, foreground=True, nothreads=True)


if __name__ == "__main__":
    main()
