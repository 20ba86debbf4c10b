"""``python -m tests.chaos``: run schedules by hand (root), print each run, optionally write the table.

python -m tests.chaos --seed 7 --duration 60 --nemesis kill,pause
python -m tests.chaos --workload all --nemesis each --fsync always,interval --markdown docs/chaos.md
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
from pathlib import Path

from tests.chaos.harness import print_report, run, workloads
from tests.chaos.schedule import refuse_inert
from tests.chaos.table import markdown, replace_table


def schedules(nemesis: str, allowed: tuple[str, ...]) -> list[list[str] | None]:
    """The runs' nemeses (None: every one the workload takes, in one schedule)."""
    if nemesis == "each":
        return [[kind] for kind in allowed] + [None]
    return [{"all": None, "none": []}.get(nemesis, nemesis.split(","))]


def main(argv: list[str] | None = None) -> int:
    known = workloads()
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--workload", default="mesh-guaranteed", help=f"{', '.join(known)}, or all")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of faults and traffic")
    parser.add_argument(
        "--nemesis",
        default="all",
        help="comma-separated (isolate, cap, kill, power, pause, cut, one-way); all: the workload's, "
        "mixed in one schedule; each: one run per nemesis, then one mixed; none: no faults",
    )
    parser.add_argument("--fsync", default="always", help="the servers' --fsync; several comma-separated")
    parser.add_argument(
        "--short", action="store_true", help="faults of 1-3 s (default 2-6 s), closer together"
    )
    parser.add_argument("--json", type=Path, help="write the reports here (a JSON list)")
    parser.add_argument(
        "--markdown", type=Path, help="put the table in this file, between its chaos-table markers"
    )
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a single run, in this process
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    if args.one:
        # A run stopped from outside still heals, stops its servers and proxies, unmounts its disks
        # and removes its namespaces: its ``finally`` blocks run.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        (kinds,) = schedules(args.nemesis, known[args.workload].nemeses)
        report = run(args.workload, seed, args.duration, kinds, args.fsync, args.short)
        print_report(report)
        print(json.dumps(report.to_json()))
        return 0 if report.valid else 1
    names = list(known) if args.workload == "all" else args.workload.split(",")
    for name in names:  # before any run: a nemesis a workload cannot act on is refused
        for kinds in schedules(args.nemesis, known[name].nemeses):
            try:
                refuse_inert(name, kinds or [], known[name].nemeses)
            except ValueError as exc:
                parser.error(str(exc))
    reports = []
    running: list[subprocess.Popen[str]] = []
    stopped: list[int] = []

    def stop(signum: int, frame: object) -> None:
        stopped.append(signum)
        for child in running:
            child.terminate()  # the run cleans up after itself, then this stops

    signal.signal(signal.SIGTERM, stop)
    for name in names:
        for kinds in schedules(args.nemesis, known[name].nemeses):
            for fsync in args.fsync.split(","):
                # Each run in a process of its own: a run moves its process into its namespaces.
                nemesis = "all" if kinds is None else ",".join(kinds) or "none"
                command = [
                    *(sys.executable, "-m", "tests.chaos", "--one", "--workload", name, "--seed", str(seed)),
                    *("--duration", str(args.duration), "--nemesis", nemesis, "--fsync", fsync),
                    *(["--short"] if args.short else []),
                ]
                print(f"seed {seed}: {name} under {nemesis}, fsync {fsync}", file=sys.stderr, flush=True)
                child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
                running[:] = [child]
                output, _ = child.communicate()
                if stopped:
                    return 128 + stopped[0]
                lines = output.strip().splitlines()
                if not lines:
                    print(f"the run failed (exit {child.returncode})", file=sys.stderr)
                    return 2
                reports.append(json.loads(lines[-1]))
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1))
    if args.markdown:
        args.markdown.write_text(replace_table(args.markdown.read_text(), markdown(reports)))
    return 0 if all(report["valid"] for report in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
