"""The event loop the ``meshplane`` command (and every server it starts) runs on.

``MESHPLANE_LOOP=uvloop`` runs it on uvloop (``pip install meshplane[uvloop]``): the mesh's p50 latency
-15%, a ZeroMQ subscriber's wake-up ~4 us shorter (docs/performance.md). The default, ``asyncio``, is
the standard loop. A program that uses meshplane as a library runs on whatever loop it chose itself;
meshplane works on both.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from meshplane.errors import ConfigError

T = TypeVar("T")
LOOPS = ("asyncio", "uvloop")


def chosen_loop(environ: Mapping[str, str] = os.environ) -> str:
    """``asyncio`` or ``uvloop``, as ``MESHPLANE_LOOP`` says; a ConfigError for anything else, or for
    uvloop when it is not installed."""
    wanted = environ.get("MESHPLANE_LOOP", "").strip().lower() or "asyncio"
    if wanted not in LOOPS:
        raise ConfigError(f"MESHPLANE_LOOP={wanted!r} is not one of {', '.join(LOOPS)}")
    if wanted == "uvloop":
        try:
            import uvloop  # noqa: F401
        except ImportError:
            raise ConfigError(
                "MESHPLANE_LOOP=uvloop, but uvloop is not installed (pip install 'meshplane[uvloop]')"
            ) from None
    return wanted


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    try:
        loop = chosen_loop()
    except ConfigError:
        main.close()  # never awaited: no "coroutine was never awaited" warning on top of the error
        raise
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
