"""``python -m tests.chaos``: run schedules by hand (root), print each run, optionally write the table.

python -m tests.chaos --seed 7 --duration 60 --nemesis kill,pause
python -m tests.chaos --nemesis each --duration 60 --markdown docs/chaos.md
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

from tests.chaos.harness import WORKLOADS, print_report, run
from tests.chaos.schedule import NEMESES
from tests.chaos.table import markdown, replace_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="mesh-guaranteed")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of faults and traffic")
    parser.add_argument(
        "--nemesis",
        default="all",
        help=f"comma-separated among {', '.join(NEMESES)}; all: mixed in one schedule; each: one run per "
        "nemesis, then one mixed; none: no faults",
    )
    parser.add_argument("--json", type=Path, help="write the reports here (a JSON list)")
    parser.add_argument(
        "--markdown", type=Path, help="put the table in this file, between its chaos-table markers"
    )
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a single run, in this process
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    if args.one:
        kinds = {"none": [], "all": list(NEMESES)}.get(args.nemesis, args.nemesis.split(","))
        report = run(args.workload, seed, args.duration, kinds)
        print_report(report)
        print(json.dumps(report.to_json()))
        return 0 if report.total.valid else 1
    schedules = [[kind] for kind in NEMESES] + [["all"]] if args.nemesis == "each" else [[args.nemesis]]
    reports = []
    for kinds in schedules:
        # Each run in a process of its own: a run moves its process into its namespaces.
        command = [
            *(sys.executable, "-m", "tests.chaos", "--one", "--workload", args.workload, "--seed", str(seed)),
            *("--duration", str(args.duration), "--nemesis", ",".join(kinds)),
        ]
        print(f"seed {seed}: {args.workload} under {','.join(kinds)}", file=sys.stderr, flush=True)
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
        lines = done.stdout.strip().splitlines()
        if not lines:
            print(f"the run failed (exit {done.returncode})", file=sys.stderr)
            return 2
        reports.append(json.loads(lines[-1]))
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1))
    if args.markdown:
        args.markdown.write_text(replace_table(args.markdown.read_text(), markdown(reports)))
    return 0 if all(report["valid"] for report in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
