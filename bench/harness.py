"""What every benchmark shares: where results go, the child-process line protocol, rates,
percentiles and ratios (``meshplane bench`` shows the progress steps: ``meshplane.cli.bench.Steps``).

Each script is run as ``python bench/NAME.py`` (its folder first on ``sys.path``), so they import this
module, and each other, by file name."""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def add_out(parser: argparse.ArgumentParser, name: str, option: str = "--out") -> None:
    """The results file option: ``bench/results/NAME.json`` unless told."""
    parser.add_argument(option, type=Path, default=RESULTS / f"{name}.json", help="where the results go")


def write_results(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")


def machine() -> dict[str, Any]:
    """What a result was measured on."""
    import os
    import platform

    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def emit(message: dict[str, Any]) -> None:
    """A child process's answer to its parent: one JSON line on stdout."""
    print(json.dumps(message), flush=True)


def rate(events: int, seconds: float) -> float:
    return round(events / seconds, 1)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median_ratio(ours: Sequence[float], peer: Sequence[float], digits: int = 2) -> float:
    """The median of per-round ratios: this VM's speed drifts within a run, and rounds interleave
    the kinds, so a ratio within one round compares like with like."""
    return round(statistics.median(o / p for o, p in zip(ours, peer, strict=True) if p), digits)
