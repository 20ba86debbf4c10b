"""The garbage collector of a long-running server process, set once it has started.

CPython's full collections walk every object the collector tracks. A mesh node holds ~50,000 from
its imports and start (functions, classes, modules) that never become garbage, and its traffic
promotes enough short-lived objects (events waiting for a group commit) to run a full collection
every ~10,000 events: ~20 ms each, 2-3 us per guaranteed event (bench/mesh_guaranteed.py, profiled).
Frozen once the server has started, those objects are walked no more; a larger first generation
makes the young collections rarer too (cyclic garbage lives a few thousand allocations longer).
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000  # allocations between two young collections (CPython's default: 700)


def settle_heap() -> None:
    """Collect once, then keep what survived out of every later collection."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
