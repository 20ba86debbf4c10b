"""``meshplane log verify|dump``: inspect a streams data directory offline, as kafka-dump-log does.

Nothing is changed: files are only read (run it on a stopped server's directory, or a copy).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from meshplane.core.keys import key_to_json
from meshplane.core.streamlog import audit_segment, decode_event, scan_records
from meshplane.errors import ConfigError


def add_log_commands(commands: Any) -> None:
    log = commands.add_parser(
        "log",
        help="check or dump a streams data directory offline",
        description="Check every record's crc and sequence (verify) or print records (dump); reads only.",
    )
    actions = log.add_subparsers(dest="log_command", required=True, metavar="ACTION")
    verify = actions.add_parser("verify", help="check every segment and metadata file; exit 1 on problems")
    verify.add_argument(
        "--data-dir", type=Path, required=True, help="the data directory of `meshplane serve`"
    )
    verify.add_argument("--json", action="store_true", help="one JSON object per log and metadata file")
    dump = actions.add_parser("dump", help="print the records of a segment file or a partition directory")
    dump.add_argument("path", type=Path, help="a .log segment file, or a directory of them")
    dump.add_argument(
        "--from-offset", type=int, default=0, metavar="N", help="first offset to print (default 0)"
    )
    dump.add_argument("--count", type=int, default=None, metavar="N", help="at most N records")
    dump.add_argument("--payload", action="store_true", help="also print each event's data")


def run_log(args: argparse.Namespace) -> int:
    if args.log_command == "verify":
        return verify(args.data_dir, as_json=args.json)
    return dump(args.path, args.from_offset, args.count, payload=args.payload)


def _segments(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.log") if p.stem.isdigit())


def _log_dirs(root: Path) -> Iterator[tuple[str, Path]]:
    for room in sorted((root / "rooms").glob("*/")):
        yield f"room {room.name}", room
    for topic in sorted((root / "topics").glob("*/")):
        for partition in sorted((p for p in topic.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
            yield f"topic {topic.name}/{partition.name}", partition


def check_log(directory: Path) -> dict[str, Any]:
    """Every segment of one log: record counts, offsets, and every problem with its place."""
    problems: list[str] = []
    records = 0
    expected: int | None = None
    files = _segments(directory)
    for n, path in enumerate(files):
        base = int(path.stem)
        if expected is not None and base != expected:
            problems.append(f"{path.name}: starts at {base}, the segment before ends at {expected}")
        following = int(files[n + 1].stem) - 1 if n + 1 < len(files) else None
        audit = audit_segment(path.read_bytes(), base, following)
        records += audit.records
        for position, problem, resumed in audit.problems:
            where = "nothing valid after it" if resumed is None else f"records resume at byte {resumed}"
            problems.append(f"{path.name}: {problem} at byte {position} ({where})")
        expected = audit.next_offset
    first = int(files[0].stem) if files else 0
    return {
        "segments": len(files),
        "records": records,
        "offsets": [first, (expected or first) - 1] if records else None,
        "problems": problems,
    }


def _check_metadata(root: Path) -> Iterator[tuple[str, list[str]]]:
    for pattern in ("rooms/*/room.json", "topics/*/topic.json", "groups/*.json"):
        for path in sorted(root.glob(pattern)):
            try:
                json.loads(path.read_bytes())
                yield str(path.relative_to(root)), []
            except (ValueError, UnicodeDecodeError) as exc:
                yield str(path.relative_to(root)), [f"not valid JSON: {exc}"]
    for path in sorted([*root.glob("groups/*.offsets"), *root.glob("idempotency.log")]):
        data = path.read_bytes()
        result = scan_records(data, expected_offset=0)
        found = [] if result.problem is None else [f"{result.problem} at byte {result.valid_end}"]
        yield str(path.relative_to(root)), found
    for path in sorted(root.rglob("*.corrupt-*")):
        yield str(path.relative_to(root)), ["set aside by the server as unreadable"]
    for path in sorted(root.rglob("quarantine/*")):
        yield str(path.relative_to(root)), [f"{path.stat().st_size} bytes set aside by recovery"]


def verify(root: Path, *, as_json: bool = False) -> int:
    if not (root / "topics").is_dir() and not (root / "rooms").is_dir():
        raise ConfigError(f"{root} is not a streams data directory (no topics/ or rooms/ in it)")
    bad = 0
    for name, directory in _log_dirs(root):
        report = check_log(directory)
        bad += bool(report["problems"])
        if as_json:
            print(json.dumps({"log": name, **report}))
            continue
        span = "empty" if report["offsets"] is None else "offsets {}..{}".format(*report["offsets"])
        status = "OK" if not report["problems"] else f"{len(report['problems'])} problem(s)"
        print(f"{name}: {report['segments']} segment(s), {report['records']} records, {span}: {status}")
        for problem in report["problems"]:
            print(f"  {problem}")
    for name, problems in _check_metadata(root):
        bad += bool(problems)
        if as_json:
            print(json.dumps({"file": name, "problems": problems}))
        elif problems:
            print(f"{name}: {'; '.join(problems)}")
    if not as_json:
        print("verified: no problems" if not bad else f"verified: {bad} file(s) or log(s) with problems")
    return 1 if bad else 0


def dump(path: Path, from_offset: int, count: int | None, *, payload: bool) -> int:
    files = _segments(path) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise ConfigError(f"{path}: no segment files (.log) there")
    printed = 0
    for file in files:
        data = file.read_bytes()
        base = int(file.stem) if file.stem.isdigit() else 0
        resumes = {pos: (problem, resumed) for pos, problem, resumed in audit_segment(data, base).problems}
        position = 0
        while position < len(data):
            result = scan_records(memoryview(data)[position:], start_position=position)
            for record in result.records:
                if record.offset < from_offset:
                    continue
                if count is not None and printed >= count:
                    return 0
                line: dict[str, Any] = {
                    "offset": record.offset,
                    "position": record.position,
                    "timestamp_ms": record.timestamp_ms,
                    "size": record.size,
                    "file": file.name,
                }
                try:
                    event = decode_event(record.payload)
                    line.update(id=event.id, event_type=event.event_type, **key_to_json(event.key))
                    if payload:
                        line["data"] = event.data if not isinstance(event.data, bytes) else event.data.hex()
                except msgspec.DecodeError:
                    line["payload_bytes"] = len(record.payload)
                print(json.dumps(line))
                printed += 1
            position = result.valid_end
            if result.problem is None:
                break
            problem, resumed = resumes.get(position, (result.problem, None))
            print(
                json.dumps(
                    {"file": file.name, "position": position, "problem": problem, "resumes_at": resumed}
                )
            )
            if resumed is None:
                break
            position = resumed
    return 0
