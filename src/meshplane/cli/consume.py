"""``meshplane topic consume`` and ``meshplane group consume``: read topics as kcat does.

``topic consume`` reads every partition (or ``-p``) from ``-o beginning|end|-N|N|s@MS`` and follows
new events until Ctrl-C, SIGTERM or SIGHUP (``-e``: exit at the end). ``group consume`` is a real
group member: it joins, reads the partitions the group assigns it from the group's committed offsets,
heartbeats, follows rebalances, and leaves on exit. It commits each batch (fenced by its generation) before
printing it: no event is printed by two members, and a crash loses at most the batch it was printing.
SIGINT, SIGTERM and SIGHUP stop a member in any phase, even one started with SIGINT ignored (a script's
background job): it finishes the batch it is committing, leaves the group (each within a bound) and says so.
Events are JSON lines on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from meshplane.aio import cancel_and_wait
from meshplane.cli.errors import EXIT_INTERRUPTED, CliError
from meshplane.streams.errors import Conflict, NotFound, OffsetOutOfRange, StreamError

if TYPE_CHECKING:  # the client needs the streams extra (aiohttp); the CLI starts without it
    from meshplane.streams.client import StreamsClient

POLL_INTERVAL = 0.2  # how often a caught-up partition is asked again
HEARTBEAT_EVERY = 1.0  # well inside any session timeout a group allows
BATCH = 500
STOP_WITHIN = 5.0  # on a stop signal: for the batch being committed to be printed, then for the leave
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def add_consume_options(parser: argparse.ArgumentParser, *, group: bool) -> None:
    if not group:
        parser.add_argument(
            "-p",
            "--partition",
            type=int,
            action="append",
            default=None,
            help="only this partition (repeatable)",
        )
        parser.add_argument(
            "-o",
            "--offset",
            default="beginning",
            help="where to start: beginning, end, N (an offset), -N (the last N of each partition) or "
            "s@MS (the first event at or after MS milliseconds since the epoch). Default beginning",
        )
    parser.add_argument("-e", "--exit-at-end", action="store_true", help="exit once every partition is read")
    parser.add_argument(
        "-c",
        "--count",
        type=int,
        default=0,
        help="exit after N events, waiting for them at the end as kcat does unless -e (default: no limit)",
    )


def start_offset(spec: str, oldest: int, end: int, by_time: int | None) -> int:
    """Where ``-o spec`` starts in a partition holding [oldest, end). Pure."""
    if spec == "beginning":
        return oldest
    if spec == "end":
        return end
    if spec.startswith("s@"):
        return by_time if by_time is not None else end
    try:
        number = int(spec)
    except ValueError:
        raise CliError(f"-o {spec!r}: use beginning, end, N, -N or s@MILLISECONDS") from None
    if number < 0:
        return max(oldest, end + number)
    return min(max(number, oldest), end)


def _timestamp(spec: str) -> int | None:
    if not spec.startswith("s@"):
        return None
    try:
        return int(spec[2:])
    except ValueError:
        raise CliError(f"-o {spec!r}: s@ takes milliseconds since the epoch, e.g. s@1767225600000") from None


class _Printer:
    """JSON lines; counts, and says when ``--count`` is reached."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.printed = 0
        self.said_waiting = False  # that -c waits at the end, said once each time the end is reached
        self.stopping = False  # a stop signal: read no more, but print what is committed
        self.committing = False  # a batch between its commit and its printing

    def print(self, topic: str, partition: int, events: list[dict[str, Any]]) -> None:
        for event in events:
            if self.done:
                return
            print(json.dumps({"topic": topic, "partition": partition, **event}, default=str), flush=True)
            self.printed += 1

    @property
    def done(self) -> bool:
        return bool(self.limit) and self.printed >= self.limit


async def _read_from(
    client: StreamsClient,
    topic: str,
    positions: dict[int, int],
    printer: _Printer,
    exit_at_end: bool,
    on_batch: Callable[[int, int], Awaitable[None]] | None = None,
) -> None:
    """Read each partition from its position until the end (``exit_at_end``), ``printer.stopping``
    or forever."""
    while not printer.done:
        progressed = False
        for partition, offset in list(positions.items()):
            if printer.stopping:
                return
            try:
                page = await client.consume_partition(topic, partition, offset, BATCH)
            except OffsetOutOfRange as exc:
                if exc.oldest <= offset:
                    raise
                say(f"{topic}/{partition}: offsets {offset}..{exc.oldest - 1} deleted by retention: skipped")
                positions[partition] = exc.oldest
                progressed = True  # read on from there before calling it the end
                continue
            events, next_offset = page["events"], int(page["next_offset"])
            if printer.limit and len(events) > printer.limit - printer.printed:
                # --count reached inside the batch: what is not printed is not committed either
                events = events[: printer.limit - printer.printed]
                next_offset = int(events[-1]["offset"]) + 1 if events else offset
            if events:
                if on_batch is not None:  # a group member commits first: a fenced commit prints nothing
                    printer.committing = True
                    await on_batch(partition, next_offset)
                printer.print(topic, partition, events)
                printer.committing = False
                positions[partition] = next_offset
                progressed = True
            if printer.done:
                return
        if not progressed:
            if exit_at_end:
                return
            if printer.limit and not printer.said_waiting:  # -c as kcat's: it waits for the rest
                printer.said_waiting = True
                say(
                    f"at the end of {topic} after {printer.printed} of {printer.limit} events: waiting for "
                    "more (-e exits at the end)"
                )
            await asyncio.sleep(POLL_INTERVAL)
        else:
            printer.said_waiting = False


async def consume_topic(client: StreamsClient, args: argparse.Namespace) -> int:
    stop = _StopSignals()
    printer = _Printer(args.count)
    try:
        await _read_topic(client, args, printer)
    except asyncio.CancelledError:
        if (stopped_by := stop.stopped_by()) is None:
            raise
        say(f"{args.topic}: stopped by {stopped_by} after {printer.printed} events")
        return EXIT_INTERRUPTED
    finally:
        stop.remove()
    return 0


async def _read_topic(client: StreamsClient, args: argparse.Namespace, printer: _Printer) -> None:
    stats = await client.topic_stats(args.topic)
    bounds = {
        int(p["partition_id"]): (int(p["min_offset"]), int(p["next_offset"])) for p in stats["partitions"]
    }
    chosen = args.partition or sorted(bounds)
    missing = [p for p in chosen if p not in bounds]
    if missing:
        raise CliError(f"topic {args.topic!r} has partitions 0..{len(bounds) - 1}, not {missing}")
    when = _timestamp(args.offset)
    by_time = await client.offsets_for_time(args.topic, when) if when is not None else {}
    positions = {p: start_offset(args.offset, *bounds[p], by_time.get(p)) for p in chosen}
    await _read_from(client, args.topic, positions, printer, args.exit_at_end)


async def consume_group(client: StreamsClient, args: argparse.Namespace) -> int:
    """A member of ``args.group``: reads its partitions, commits what it printed, follows rebalances."""
    stop = _StopSignals()
    printer = _Printer(args.count)
    member = str(uuid.uuid4())  # ours before the join: a stop during the join can still leave
    joining = False  # from the join on: a stop leaves
    reading: asyncio.Task[None] | None = None
    try:
        topic = await _group_topic(client, args.group, args.topic)
        joining = True
        generation = int((await client.join(args.group, member_id=member))["generation"])
        while True:
            assigned = (await client.assignment(args.group, member))["partitions"]
            say(f"member {member} of {args.group}: generation {generation}, partitions {assigned}")
            oldest = {
                int(p["partition_id"]): int(p["min_offset"])
                for p in (await client.topic_stats(topic))["partitions"]
            }
            positions = {p: max(await client.committed(args.group, p) or 0, oldest[p]) for p in assigned}

            async def commit(partition: int, offset: int, generation: int = generation) -> None:
                await client.commit(args.group, partition, offset, member_id=member, generation=generation)

            reading = asyncio.create_task(
                _read_from(client, topic, positions, printer, args.exit_at_end, commit)
            )
            while not reading.done():
                await asyncio.wait({reading}, timeout=HEARTBEAT_EVERY)
                beat = await client.heartbeat(args.group, member)  # keeps the session; says when to rebalance
                if int(beat["generation"]) != generation:
                    generation = int(beat["generation"])
                    await cancel_and_wait(reading)
            if reading.cancelled():
                continue  # rebalanced: read the new assignment
            try:
                reading.result()
            except StreamError as exc:  # a fenced commit: the group moved on while we read
                say(f"member {member}: {exc}; rejoining")
                generation = int((await client.heartbeat(args.group, member))["generation"])
                continue
            return 0
    except asyncio.CancelledError:
        if (stopped_by := stop.stopped_by()) is None:
            raise
        joined, joining = joining, False  # a second signal ends the way out: no leave again in `finally`
        unfinished = await _stop_reading(reading, printer)
        left = await _leave(client, args.group, member) if joined else "it had not joined"
        said = f"member {member} of {args.group}: stopped by {stopped_by}"
        say(
            f"{said} after {printer.printed} events, each committed before it was printed; {left}{unfinished}"
        )
        return EXIT_INTERRUPTED
    finally:
        stop.task = None  # a signal on the way out ends it at once
        try:
            if joining and (left := await _leave(client, args.group, member)) != LEFT:
                say(f"member {member} of {args.group}: {left}")
        finally:
            stop.remove()


class _StopSignals:
    """SIGINT, SIGTERM and SIGHUP cancel ``task`` (the one that made this); a second signal, or one
    once ``task`` is None, raises KeyboardInterrupt. Installed on the loop, so a SIGINT the process
    inherited ignored is caught too."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self.task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        for stop_signal in STOP_SIGNALS:
            self._loop.add_signal_handler(stop_signal, self._on_signal, stop_signal)

    def stopped_by(self) -> str | None:
        """The stop signal the cancellation being handled came from (taken back, so that the way out
        can await), or None: not ours."""
        if self.received is None or self.task is None:
            return None
        self.task.uncancel()
        return self.received.name

    def _on_signal(self, received: signal.Signals) -> None:
        if self.received is not None or self.task is None:
            raise KeyboardInterrupt  # asked twice, or on the way out: out now, past the bounds
        self.received = received
        self.task.cancel()

    def remove(self) -> None:
        for stop_signal in STOP_SIGNALS:
            self._loop.remove_signal_handler(stop_signal)


async def _stop_reading(reading: asyncio.Task[None] | None, printer: _Printer) -> str:
    """Stop the reader; a batch it is committing is printed first if its commit answers within a bound."""
    printer.stopping = True
    if reading is None or reading.done():
        return ""
    if printer.committing:
        await asyncio.wait({reading}, timeout=STOP_WITHIN)
    committing = printer.committing and not reading.done()
    await cancel_and_wait(reading)  # a fetch or the poll's sleep: nothing is lost by cancelling them
    if reading.done() and not reading.cancelled():
        reading.exception()  # retrieved: a failed fetch on the way out is not worth a traceback
    if committing:
        return f"; a commit had no answer within {STOP_WITHIN:g}s: if it landed, its batch was not printed"
    return ""


LEFT = "left the group"


async def _leave(client: StreamsClient, group: str, member: str) -> str:
    """Leave ``group`` within a bound; what happened, said as the end of a sentence."""
    try:
        async with asyncio.timeout(STOP_WITHIN):
            await client.leave(group, member)
    except NotFound:
        pass  # never got in (a stop during the join), or expelled already
    except (StreamError, TimeoutError) as exc:
        return (
            f"could not leave the group within {STOP_WITHIN:g}s ({exc or 'no answer'}): its partitions go "
            "to the other members when its session times out"
        )
    return LEFT


async def _group_topic(client: StreamsClient, group: str, create_on: str | None) -> str:
    try:
        return str((await client.group_stats(group))["topic"])
    except NotFound:
        if create_on is None:
            raise CliError(
                f"consumer group {group!r} does not exist: add --topic TOPIC to create it, or "
                f"`meshplane group create {group} TOPIC`"
            ) from None
    try:
        await client.create_group(group, create_on)
    except Conflict:  # another member made it first
        return str((await client.group_stats(group))["topic"])
    say(f"created consumer group {group!r} on topic {create_on!r}")
    return create_on


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
