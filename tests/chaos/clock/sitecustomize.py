"""Wall-clock jumps for the fault harness's clock nemesis: a server started with this directory on
``PYTHONPATH`` and ``MESHPLANE_CHAOS_CLOCK=FILE`` reads its wall clock (``time.time``,
``time.time_ns``) as the real one plus the seconds ``FILE`` holds, re-read every 100 ms. The
monotonic clock is left alone, as a real clock step leaves it. (libfaketime would do this from
outside, but its ``DONT_FAKE_MONOTONIC`` breaks Python's ``time.sleep`` with EINVAL.)"""

import os
import threading
import time

_FILE = os.environ.get("MESHPLANE_CHAOS_CLOCK")

if _FILE:
    _real_time, _real_time_ns = time.time, time.time_ns
    _offset = [0.0]

    def _read(path: str) -> None:
        try:
            with open(path) as file:
                offset = float(file.read().strip() or 0)
        except (OSError, ValueError):
            return  # torn or missing: the last offset stays
        if offset != _offset[0]:
            _offset[0] = offset
            with open(path + ".seen", "w") as seen:  # the harness's evidence that the step arrived
                seen.write(str(offset))

    def _watch(path: str) -> None:
        while True:
            time.sleep(0.1)
            _read(path)

    _read(_FILE)

    threading.Thread(target=_watch, args=(_FILE,), name="chaos-clock", daemon=True).start()
    time.time = lambda: _real_time() + _offset[0]
    time.time_ns = lambda: _real_time_ns() + int(_offset[0] * 1e9)
