"""Child processes in tests: whether a paused one has really stopped."""

from __future__ import annotations

import contextlib
from pathlib import Path


def stopped(pid: int) -> bool:
    """Every thread of ``pid`` is stopped: SIGSTOP takes effect a moment after kill() returns."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
    return bool(states) and all(state in ("T", "t") for state in states)
