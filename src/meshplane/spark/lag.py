"""Kafka's lag metrics for a meshplane source, from a query's progress.

PySpark 4.3's Python sources cannot report custom metrics (its ``PythonMicroBatchStream`` does not
implement ``ReportsSourceMetrics``), so ``sources[].metrics`` stays empty. Each progress entry does
carry the batch's ``endOffset`` and the source's ``latestOffset`` (from ``reportLatestOffset``): the
lag follows from them.

    for source in query.lastProgress["sources"]:
        print(offsets_behind(source))   # {"avgOffsetsBehindLatest": 12.5, "max...": 20, "min...": 5}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def _offsets(value: Any) -> dict[str, dict[str, int]]:
    if isinstance(value, str):
        value = json.loads(value)
    return {str(t): {str(p): int(o) for p, o in parts.items()} for t, parts in (value or {}).items()}


def offsets_behind(source: Mapping[str, Any]) -> dict[str, float | int]:
    """``avgOffsetsBehindLatest``, ``maxOffsetsBehindLatest`` and ``minOffsetsBehindLatest`` over the
    partitions of one ``query.lastProgress["sources"]`` entry (as Kafka's source reports them)."""
    end, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
    behind = [max(0, o - end.get(t, {}).get(p, 0)) for t, parts in latest.items() for p, o in parts.items()]
    if not behind:
        return {}
    return {
        "avgOffsetsBehindLatest": sum(behind) / len(behind),
        "maxOffsetsBehindLatest": max(behind),
        "minOffsetsBehindLatest": min(behind),
    }
