"""``meshplane bench``: the benchmark scripts of a source checkout (``bench/``) behind one command.

Each script runs in its own process, as ``python bench/NAME.py`` would, and reports its steps between
its result lines (``Steps``): at a terminal they show as progress bars, elsewhere as a line per step.
The result lines are printed as they come; a script's stderr is shown only when it fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from meshplane.cli.errors import CliError

#: Set for a script run by this command: its ``Steps`` then report on stdout, between its result lines.
PROGRESS_ENV = "MESHPLANE_BENCH_PROGRESS"
#: How a step line starts (a record separator, so no result line is taken for one).
STEP_MARK = "\x1emeshplane-step "

#: The benchmarks, in the order `meshplane bench` runs them, and what each measures.
BENCHMARKS = {
    "event_plane": "event plane throughput and latency against raw pyzmq and nats-py",
    "zmq_ceiling": "the event plane over ZeroMQ against libzmq's own C throughput test",
    "broker_mode": "ZeroMQ broker mode against a raw XSUB/XPUB proxy",
    "streams": "durable streams against Redis Streams and NATS JetStream",
    "security_cost": "what CURVE, TLS and HTTPS cost",
    "mesh": "the event mesh against nats-server clusters and gateways",
    "mesh_guaranteed": "guaranteed events: spooling, recovery, HA takeover",
    "nats_door": "the NATS door against a nats-server cluster, with the same nats-py client",
    "spark_ingest": "Spark ingest from a streams server (not run by default: it takes minutes)",
}
DEFAULT = [name for name in BENCHMARKS if name != "spark_ingest"]


class Steps:
    """A bench script's progress for ``meshplane bench``: a marked line on stdout per finished step, in
    order with the script's own lines; nothing when the script is run by hand."""

    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0
        self._report = os.environ.pop(PROGRESS_ENV, None) is not None  # popped: its children are not ours

    def step(self, what: str) -> None:
        self.done += 1
        if self._report:
            step = {"done": self.done, "total": self.total, "what": what}
            print(STEP_MARK + json.dumps(step), flush=True)


def add_bench_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"benchmarks to run (default: all but spark_ingest): {', '.join(BENCHMARKS)}",
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="the bench/ folder (default: ./bench, else the checkout meshplane is installed from)",
    )
    parser.add_argument(
        "--args",
        default="",
        help="arguments for every script, e.g. '--events 20000' (see python bench/NAME.py --help)",
    )


def find_bench_dir(given: Path | None) -> Path:
    candidates = [given] if given else [Path.cwd() / "bench", Path(__file__).resolve().parents[3] / "bench"]
    for folder in candidates:
        if (folder / "event_plane.py").is_file():
            return folder
    where = given or "./bench"
    raise CliError(
        f"no benchmarks in {where}: they live in a source checkout's bench/ folder "
        "(git clone the meshplane repository, then run meshplane bench there, or pass --dir)"
    )


async def run_bench(args: argparse.Namespace) -> int:
    if args.list:
        for name, what in BENCHMARKS.items():
            print(f"{name:16} {what}")
        return 0
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        raise CliError(f"no benchmark named {', '.join(unknown)} (choose from {', '.join(BENCHMARKS)})")
    folder = find_bench_dir(args.dir)
    try:
        from rich.console import Console
    except ImportError:
        raise CliError("meshplane bench needs the bench extra: pip install 'meshplane[bench]'") from None
    console = Console(soft_wrap=True)  # a result line stays one line in logs
    names = args.names or DEFAULT
    failed = []
    for name in names:
        code = await _run_one(folder / f"{name}.py", shlex.split(args.args), console)
        if code != 0:
            failed.append(f"{name} (exit {code})")
    if failed:
        console.print(f"meshplane: benchmarks failed: {', '.join(failed)}", style="red", highlight=False)
        return 1
    console.print(f"{len(names)} benchmark(s) done", highlight=False)
    return 0


async def _run_one(script: Path, extra: list[str], console: Any) -> int:
    env = {**os.environ, PROGRESS_ENV: "1", "PYTHONUNBUFFERED": "1"}  # unbuffered: lines as they come
    with tempfile.TemporaryFile() as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(script), *extra, stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env
        )
        assert proc.stdout is not None
        with _progress(console, script.stem) as show:
            while raw := await proc.stdout.readline():
                line = raw.decode(errors="replace").rstrip("\n")
                step = _step(line)
                if step is not None:
                    show(step)
                else:
                    console.print(line, highlight=False, markup=False)
            code = await proc.wait()
        if code != 0:
            stderr.seek(0)
            tail = stderr.read().decode(errors="replace").splitlines()[-20:]
            console.print("\n".join(tail), highlight=False, markup=False, style="dim")
    return code


def _step(line: str) -> dict[str, Any] | None:
    if not line.startswith(STEP_MARK):
        return None
    with contextlib.suppress(ValueError, KeyError, TypeError):  # a garbled mark is shown as it is
        step = json.loads(line[len(STEP_MARK) :])
        return {"done": int(step["done"]), "total": int(step["total"]), "what": str(step["what"])}
    return None


@contextlib.contextmanager
def _progress(console: Any, name: str) -> Any:
    """A bar per benchmark at a terminal; elsewhere (CI logs, pipes) a line per step."""
    if not console.is_terminal:
        yield lambda step: console.print(
            f"[{name} {step['done']}/{step['total']}] {step['what']}", highlight=False, markup=False
        )
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task(name, total=None)

        def show(step: dict[str, Any]) -> None:
            progress.update(
                task, completed=step["done"], total=step["total"], description=f"{name}: {step['what']}"
            )

        yield show
