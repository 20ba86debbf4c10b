"""One server per data directory: the lock refuses a second holder with the first one's pid, and a
standby gets it once the holder lets go."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from meshplane.errors import ConfigError
from meshplane.streams.lock import DataDirLock


async def test_a_second_holder_is_refused_and_a_standby_takes_over(tmp_path: Path) -> None:
    first, second = DataDirLock(tmp_path), DataDirLock(tmp_path)
    first.acquire()
    with pytest.raises(ConfigError, match=f"in use by another meshplane server \\(pid {os.getpid()}\\)"):
        second.acquire()
    stop = asyncio.Event()
    standby = asyncio.create_task(second.wait(stop, interval=0.01))
    await asyncio.sleep(0.05)
    assert not standby.done()  # still waiting while the first holds it
    first.release()
    assert await asyncio.wait_for(standby, 5)
    assert not first.try_acquire()
    second.release()


async def test_a_waiting_standby_stops_when_asked(tmp_path: Path) -> None:
    holder, standby = DataDirLock(tmp_path), DataDirLock(tmp_path)
    holder.acquire()
    stop = asyncio.Event()
    waiting = asyncio.create_task(standby.wait(stop, interval=0.01))
    stop.set()
    assert await asyncio.wait_for(waiting, 5) is False
    holder.release()
