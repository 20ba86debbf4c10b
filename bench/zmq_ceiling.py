"""The event plane against ZeroMQ's own ceiling on this machine, same run (issue 38, goal 6).

    python bench/zmq_ceiling.py                   # results to bench/results/zmq_ceiling.json

The ceiling is ``zmq_ceiling.c``, measured as libzmq's ``perf/local_thr`` and ``remote_thr`` do: a C
process PUSHes 100-byte messages over TCP loopback, another PULLs them, rate from the first message
received to the last. It is built here with ``cc`` against ``zmq.h`` (``make zmq-headers`` installs
Debian's libzmq3-dev) and linked to the libzmq that pyzmq loads: the one meshplane runs on. In the
same rounds, ``bench/event_plane.py``'s pairs: meshplane over ZeroMQ with the 8-byte header, one
``publish`` and one ``async for`` per event (``zmq8-meshplane``) and 1,000 at a time (``zmq8-batch``),
and raw pyzmq (``zmq8-raw``). A ratio is the median of the rounds' ratios.

The C pair runs twice: as libzmq's perf tools do (PUSH to PULL, one 100-byte frame: the ceiling the
goal names), and in the shape an event of the 8-byte-header layout travels in (PUB to SUB, the topic
frame, then the 8-byte header and the envelope, 169 bytes: ``c-libzmq-same-shape``), so that what
libzmq itself pays for two frames and topic filtering is apart from what meshplane adds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import zmq

from event_plane import PAYLOAD_SIZE, TOPIC, header8_frames, payload, run_pair
from harness import add_out, write_results
from meshplane.cli.bench import Steps

SOURCE = Path(__file__).with_name("zmq_ceiling.c")
KINDS = ("zmq8-meshplane", "zmq8-batch", "zmq8-raw")


def pyzmq_libzmq() -> list[str]:
    """How to link the libzmq pyzmq loads: its bundled copy (a wheel's), else the system's."""
    bundled = sorted((Path(zmq.__file__).parent.parent / "pyzmq.libs").glob("libzmq*.so*"))
    if bundled:
        return [str(bundled[0]), f"-Wl,-rpath,{bundled[0].parent}"]
    return ["-lzmq"]


def build(folder: Path) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("zmq_ceiling: no C compiler (make compiler installs gcc)")
    binary = folder / "zmq_ceiling"
    command = [compiler, "-O2", "-o", str(binary), str(SOURCE), *pyzmq_libzmq()]
    built = subprocess.run(command, capture_output=True, text=True)
    if built.returncode != 0:
        raise SystemExit(
            f"zmq_ceiling: cannot build {SOURCE.name} (make zmq-headers installs zmq.h):\n{built.stderr}"
        )
    return binary


def c_pair(binary: Path, events: int, size: int = PAYLOAD_SIZE, topic: str = "") -> dict[str, Any]:
    shape = [topic] if topic else []
    local = subprocess.Popen(
        [str(binary), "local", "tcp://127.0.0.1:*", str(size), str(events), *shape],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert local.stdout is not None
    endpoint = local.stdout.readline().strip()
    remote = subprocess.run([str(binary), "remote", endpoint, str(size), str(events), *shape], timeout=300)
    result = local.stdout.readline()
    if remote.returncode != 0 or local.wait(60) != 0 or not result:
        raise SystemExit("zmq_ceiling: the C pair failed")
    measured: dict[str, Any] = json.loads(result)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000, help="messages per run (default 1 M)")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds (default 3)")
    add_out(parser, "zmq_ceiling")
    args = parser.parse_args()
    os.environ.setdefault("MESHPLANE_SEND_WHEN_FULL", "wait")  # as event_plane.py: every event delivered
    steps = Steps(1 + args.repeat)
    body = len(header8_frames(0, payload(0))[1])
    rounds: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as folder:
        binary = build(Path(folder))
        steps.step("built against pyzmq's libzmq")
        for n in range(args.repeat):
            this_round = {"c-libzmq": float(c_pair(binary, args.events)["rate"])}
            this_round["c-libzmq-same-shape"] = float(c_pair(binary, args.events, body, TOPIC)["rate"])
            for kind in KINDS:
                this_round[kind] = float(run_pair(kind, args.events, False, 0.0, "")["rate"])
            rounds.append(this_round)
            print(f"round {n + 1}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in this_round.items()))
            steps.step(f"round {n + 1}/{args.repeat}")
    results: dict[str, Any] = {
        "events": args.events,
        "payload_bytes": PAYLOAD_SIZE,
        "libzmq": zmq.zmq_version(),
        "rate_median": {k: statistics.median(r[k] for r in rounds) for k in rounds[0]},
        "rounds": rounds,
        "ratios_to_c_ceiling": {
            kind: round(statistics.median(r[kind] / r["c-libzmq"] for r in rounds), 3) for kind in KINDS
        },
        "ratios_to_c_same_shape": {
            kind: round(statistics.median(r[kind] / r["c-libzmq-same-shape"] for r in rounds), 3)
            for kind in KINDS
        },
    }
    for kind, ratio in results["ratios_to_c_ceiling"].items():
        same_shape = results["ratios_to_c_same_shape"][kind]
        print(f"{kind} / libzmq C ceiling: {ratio}x, / C in the same shape: {same_shape}x (median of rounds)")
    write_results(args.out, results)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
