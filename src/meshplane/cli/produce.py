"""``meshplane topic produce``: publish standard input, one event per line, keyed as kcat -P -K does."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from meshplane.cli.errors import CliError
from meshplane.cli.tables import plural

if TYPE_CHECKING:  # the client needs the streams extra (aiohttp); the CLI starts without it
    from meshplane.streams.client import StreamsClient

BATCH = 500


def add_produce_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topic", help="topic name")
    parser.add_argument(
        "-K",
        "--key-delimiter",
        default=None,
        metavar="DELIM",
        help='each line is KEY DELIM VALUE (e.g. -K : for `customer-7:{"id": 1}`); none: no key',
    )
    parser.add_argument("--event-type", default="message", help="event type of every event")
    parser.add_argument(
        "--text", action="store_true", help="send every value as a string (default: JSON when it parses)"
    )


def json_or_text(value: str, what: str, hint: str) -> Any:
    """JSON when it parses; other text as a string, unless it was meant as JSON and is broken."""
    try:
        return json.loads(value)
    except ValueError as exc:
        if value.lstrip()[:1] in ("{", "[", '"'):
            raise CliError(f"{what} is not valid JSON ({exc}): {value[:60]!r}; {hint}") from None
        return value


def parse_line(line: str, number: int, delimiter: str | None, text: bool) -> dict[str, Any]:
    """One event from one input line. Pure."""
    key = None
    value = line
    if delimiter is not None:
        key, found, value = line.partition(delimiter)
        if not found:
            raise CliError(f"line {number} has no key delimiter {delimiter!r}: {line[:60]!r}")
    data = value if text else json_or_text(value, f"line {number}", "--text sends lines as strings")
    event: dict[str, Any] = {"data": data}
    if key is not None:
        event["key"] = key
    return event


async def produce(client: StreamsClient, args: argparse.Namespace) -> int:
    """Publish stdin in batches; each batch is appended whole or not at all."""
    batch: list[dict[str, Any]] = []
    sent = 0
    for number, raw in enumerate(sys.stdin, start=1):
        line = raw.rstrip("\n")
        if not line:
            continue
        event = parse_line(line, number, args.key_delimiter, args.text)
        batch.append({"event_type": args.event_type, **event})
        if len(batch) >= BATCH:
            await client.publish_batch(args.topic, batch)
            sent, batch = sent + len(batch), []
    if batch:
        await client.publish_batch(args.topic, batch)
        sent += len(batch)
    print(f"published {plural(sent, 'event')} to {args.topic}", file=sys.stderr)
    return 0
