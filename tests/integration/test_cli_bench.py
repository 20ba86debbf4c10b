"""`meshplane bench`: the checkout's benchmark scripts behind one command, steps between result lines."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from meshplane.cli.bench import BENCHMARKS
from tests.support.cli import run_cli

REPO = Path(__file__).resolve().parents[2]


def bench(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return run_cli("bench", *args, timeout=120, cwd=cwd)


def test_list_names_every_script_of_the_checkout() -> None:
    result = bench("--list")
    assert result.returncode == 0, result.stderr
    listed = [line.split()[0] for line in result.stdout.splitlines()]
    assert listed == list(BENCHMARKS)
    assert all((REPO / "bench" / f"{name}.py").is_file() for name in listed)


def test_a_real_benchmark_reports_its_steps_in_order_with_its_results(tmp_path: Path) -> None:
    out = tmp_path / "mesh_guaranteed.json"
    result = bench("mesh_guaranteed", "--args", f"--events 2000 --spooled 1000 --mirrored 1000 --out {out}")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    steps = [line for line in lines if line.startswith("[mesh_guaranteed ")]
    assert steps == [
        "[mesh_guaranteed 1/7] direct events",
        "[mesh_guaranteed 2/7] guaranteed events",
        "[mesh_guaranteed 3/7] guaranteed events, a sliding window",
        "[mesh_guaranteed 4/7] recovery of a spool",
        "[mesh_guaranteed 5/7] against raw JetStream R1",
        "[mesh_guaranteed 6/7] HA takeover",
        "[mesh_guaranteed 7/7] mirrored mates",
    ]
    direct = next(i for i, line in enumerate(lines) if line.startswith("direct "))
    assert lines[direct + 1] == steps[0]  # a step follows the result it finished
    assert lines[-1] == "1 benchmark(s) done"
    assert json.loads(out.read_text())["events"] == 2000  # the arguments reached the script


def test_a_failing_script_shows_its_error_and_fails_the_run(tmp_path: Path) -> None:
    (tmp_path / "event_plane.py").write_text("print('fine')\n")
    (tmp_path / "broker_mode.py").write_text("print('partial result')\nraise SystemExit('no broker: boom')\n")
    result = bench("event_plane", "broker_mode", "--dir", str(tmp_path))
    assert result.returncode == 1
    assert "fine" in result.stdout
    assert "partial result" in result.stdout
    assert "no broker: boom" in result.stdout
    assert "benchmarks failed: broker_mode (exit 1)" in result.stdout


def test_outside_a_checkout_and_unknown_names_are_one_line_errors(tmp_path: Path) -> None:
    outside = bench("--dir", str(tmp_path))
    assert outside.returncode == 2
    assert outside.stderr.startswith("meshplane: error: no benchmarks in ")
    assert len(outside.stderr.splitlines()) == 1
    unknown = bench("event_plain")
    assert unknown.returncode == 2
    assert "no benchmark named event_plain" in unknown.stderr
    assert "Traceback" not in outside.stderr + unknown.stderr
