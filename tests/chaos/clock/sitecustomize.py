"""Wall-clock jumps for the fault harness's clock nemesis: a server started with this directory on
``PYTHONPATH`` and ``MESHPLANE_CHAOS_CLOCK=FILE`` reads its wall clock (``time.time``,
``time.time_ns``) as the real one plus the seconds ``FILE`` holds, re-read every 100 ms. The
monotonic clock is left alone, as a real clock step leaves it. (libfaketime would do this from
outside, but its ``DONT_FAKE_MONOTONIC`` breaks Python's ``time.sleep`` with EINVAL.)

grpc's modules keep the real clock: grpc's Python layer turns a call's timeout into a wall-clock
deadline (``time.time() + timeout``) that its C core, which this file cannot reach, converts back
against the real clock. After a real step both read the same stepped clock and the deadline is
the timeout from now; here they would disagree by the step (a step back expired every etcd call
at once). So the step reaches meshplane's own code and the libraries in Python, not grpc's
bookkeeping of its own deadlines."""

import importlib.abc
import importlib.machinery
import os
import sys
import threading
import time
import types
from collections.abc import Sequence

_FILE = os.environ.get("MESHPLANE_CHAOS_CLOCK")


class _RealClockForGrpc(importlib.abc.MetaPathFinder):
    """Loads ``grpc`` and its submodules with a ``time`` module of the real clock."""

    def __init__(self, real: types.SimpleNamespace) -> None:
        self.real = real

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != "grpc" and not name.startswith("grpc."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, real = spec.loader, self.real

        def exec_module(module: types.ModuleType) -> None:
            type(loader).exec_module(loader, module)
            if getattr(module, "time", None) is time:
                module.time = real  # type: ignore[attr-defined]

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


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
    sys.meta_path.insert(0, _RealClockForGrpc(types.SimpleNamespace(**vars(time))))
    time.time = lambda: _real_time() + _offset[0]
    time.time_ns = lambda: _real_time_ns() + int(_offset[0] * 1e9)
