"""The options of ``format("meshplane")``: Kafka's names and meanings, checked strictly at ``load()`` /
``save()``. No Spark, no network: defaults come from the environment and the selected context.

Every option is listed in :data:`SOURCE_OPTIONS` or :data:`SINK_OPTIONS` (case-insensitive: Spark
passes them in lower case); anything else, or a bad value, is a :class:`SparkOptionError` naming the
option and what it accepts. ``kafka.*`` options say what meshplane uses instead.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshplane import context
from meshplane.core.mesh.vpn import check_vpn
from meshplane.errors import MeshplaneError
from meshplane.spark import offsets as off

DEFAULT_URL = "http://127.0.0.1:15500"
log = logging.getLogger(__name__)


class SparkOptionError(MeshplaneError, ValueError):
    """An option of the meshplane format that is unknown or has a value it cannot take."""

    kind = "bad_request"


#: Option -> what it takes, for the source (read and readStream).
SOURCE_OPTIONS = {
    "url": "the streams server, http(s)://host:port, or several serving the same streams, "
    "comma-separated (default $MESHPLANE_STREAMS_URL, the context's, or " + DEFAULT_URL + ")",
    "token": "a bearer token (default $MESHPLANE_STREAMS_TOKEN)",
    "vpn": "the Message VPN to work in, for the server's operator token (sent as X-Meshplane-Vpn; default "
    "$MESHPLANE_STREAMS_VPN or the context's; a VPN's own token needs none)",
    "topic": "topic names, comma-separated (alias of subscribe)",
    "topics": "topic names, comma-separated (alias of subscribe)",
    "subscribe": "topic names, comma-separated",
    "subscribePattern": "a regular expression matched against whole topic names",
    "assign": 'JSON {"topic": [0, 1]}: only these partitions',
    "startingOffsets": 'earliest | latest | JSON {"topic": {"0": 5}} (-2 earliest, -1 latest)',
    "endingOffsets": 'latest | JSON {"topic": {"0": 5}} (-1 latest; batch reads only)',
    "startingTimestamp": "milliseconds since the epoch: every partition starts at its first event then",
    "startingOffsetsByTimestampStrategy": "error | latest: a start time no event is stamped at or after "
    "fails the query, or starts at the end (default error, as Kafka's)",
    "startingOffsetsByTimestamp": 'JSON {"topic": {"0": 1700000000000}}: per partition, in milliseconds',
    "endingTimestamp": "milliseconds since the epoch (batch reads only)",
    "endingOffsetsByTimestamp": 'JSON {"topic": {"0": 1700000000000}} (batch reads only)',
    "maxOffsetsPerTrigger": "an integer >= 1: events per micro-batch at most",
    "maxEventsPerTrigger": "an integer >= 1 (alias of maxOffsetsPerTrigger)",
    "minOffsetsPerTrigger": "an integer >= 1: wait for this many events (up to maxTriggerDelay)",
    "maxTriggerDelay": "a duration like 15m, 10min, 30s or 500ms, as Spark writes them (default 15m)",
    "failOnDataLoss": "true | false (default true)",
    "minPartitions": "an integer >= 1: split ranges so a batch has at least this many Spark partitions",
    "includeHeaders": "true | false: add Kafka's headers column (the events' metadata)",
    "columns": "kafka | legacy: Kafka's columns first, a binary key (default), or meshplane's earlier order "
    "(a string key; event_type, id, metadata before timestampType)",
    "readerName": "the name a streaming query's progress is recorded under on the server, for its lag "
    "(default: each query its own, spark-query-<queryName> or spark-<its checkpoint's query id>; empty: "
    "not recorded)",
    "fetchMaxBytes": "an integer >= 1024: bytes per fetch (default 2 MiB)",
    "localReads": "true | false: read segment files directly on the server's host (default true)",
    "arrow": "true | false: yield Arrow batches (default true)",
    "requestTimeoutMs": "an integer >= 1: one request's timeout (default 60000)",
    "retryTimeoutMs": "an integer >= 0: how long to retry an unreachable server (default 60000)",
}
#: Option -> what it takes, for the sink (write and writeStream).
SINK_OPTIONS = {
    "url": SOURCE_OPTIONS["url"],
    "token": SOURCE_OPTIONS["token"],
    "vpn": SOURCE_OPTIONS["vpn"],
    "topic": "the topic to publish to (wins over a topic column, as in Kafka)",
    "eventType": "event_type of published events without an event_type column (default spark)",
    "valueFormat": "strict | json: values that are not binary or string are refused, or sent as JSON",
    "requestTimeoutMs": SOURCE_OPTIONS["requestTimeoutMs"],
    "retryTimeoutMs": SOURCE_OPTIONS["retryTimeoutMs"],
}
#: Options Spark itself sets or passes along, which the format accepts and ignores.
SPARK_OWN = {"path", "checkpointlocation", "queryname"}
#: What meshplane reads instead of a ``kafka.*`` option (any other: url and token).
KAFKA_INSTEAD = {
    "kafka.bootstrap.servers": "url",
    "kafka.security.protocol": "url with https:// and token",
    "kafka.sasl.jaas.config": "token",
    "kafka.group.id": "nothing (the checkpoint is the position; each query has its own lag view)",
    "kafka.auto.offset.reset": "startingOffsets",
}
#: Kafka's tuning options: accepted so that a Kafka job ports as it is, with a warning that they do
#: not apply (lower case: as Spark hands them).
KAFKA_TUNING = {
    "maxrecordsperpartition": "maxRecordsPerPartition",
    "groupidprefix": "groupIdPrefix",
    "kafkaconsumer.polltimeoutms": "kafkaConsumer.pollTimeoutMs",
    "fetchoffset.numretries": "fetchOffset.numRetries",
    "fetchoffset.retryintervalms": "fetchOffset.retryIntervalMs",
}
# Spark's time strings (JavaUtils.timeStringAs): an integer and a unit, milliseconds when none is given.
_DURATION = re.compile(r"^\s*(\d+)\s*(us|ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_SECONDS = {
    "us": 1e-6,
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "": 0.001,
}


def _check_names(given: Mapping[str, Any], known: Mapping[str, str], what: str) -> tuple[str, ...]:
    """Refuse unknown options; returns Kafka's that do not apply here (each said in a warning)."""
    by_lower = {k.lower(): k for k in known}
    ignored = []
    for name in given:
        lower = name.lower()  # Spark hands option names in lower case
        if lower in by_lower or lower in SPARK_OWN:
            continue
        if lower.startswith("kafka.") or lower in KAFKA_TUNING:
            shown = KAFKA_TUNING.get(lower, lower)
            instead = KAFKA_INSTEAD.get(lower, "url and token" if lower.startswith("kafka.") else "nothing")
            log.warning(
                "option %s is Kafka's and does not apply to meshplane (it uses %s); ignored", shown, instead
            )
            ignored.append(shown)
            continue
        close = difflib.get_close_matches(lower, by_lower, n=1)
        hint = f"did you mean {by_lower[close[0]]}? " if close else ""
        raise SparkOptionError(
            f"unknown option {name!r} for the meshplane {what}; {hint}it takes: {', '.join(sorted(known))}"
        )
    return tuple(ignored)


class _Reader:
    """Case-insensitive typed access to Spark's options, with messages naming the option."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self._values = {str(k).lower(): v for k, v in options.items() if v is not None}

    def text(self, *names: str) -> str | None:
        for name in names:
            if name.lower() in self._values:
                return str(self._values[name.lower()])
        return None

    def boolean(self, name: str, default: bool) -> bool:
        value = self.text(name)
        if value is None:
            return default
        if value.strip().lower() not in ("true", "false"):
            raise SparkOptionError(f"option {name} must be true or false, not {value!r}")
        return value.strip().lower() == "true"

    def integer(self, *names: str, default: int | None, minimum: int) -> int | None:
        value = self.text(*names)
        if value is None:
            return default
        try:
            number = int(value.strip())
        except ValueError:
            number = minimum - 1
        if number < minimum:
            raise SparkOptionError(f"option {names[0]} must be an integer >= {minimum}, not {value!r}")
        return number

    def duration(self, name: str, default: float) -> float:
        value = self.text(name)
        if value is None:
            return default
        match = _DURATION.match(value)
        if match is None:
            raise SparkOptionError(
                f"option {name} must be a duration like 15m, 10min, 30s or 500ms, not {value!r}"
            )
        return int(match.group(1)) * _UNIT_SECONDS[(match.group(2) or "").lower()]


def _server(read: _Reader) -> tuple[str, str | None, str | None]:
    """(url, token, VPN): the options', else the environment's or the selected context's."""
    env = context.environment()
    url = read.text("url") or env.get("MESHPLANE_STREAMS_URL") or DEFAULT_URL
    for each in url.split(","):  # several servers of the same streams: any of them
        parsed = urllib.parse.urlsplit(each.strip())
        if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.path not in ("", "/"):
            raise SparkOptionError(f"option url must look like http://host:port (no path), not {each!r}")
        try:
            parsed.port  # noqa: B018 - raises on a bad port
        except ValueError:
            raise SparkOptionError(f"option url has a bad port: {each!r}") from None
    vpn = read.text("vpn") or env.get("MESHPLANE_STREAMS_VPN") or None
    if vpn is not None:
        try:
            check_vpn(vpn)  # it travels in a header: a name, never a line break
        except ValueError as exc:
            raise SparkOptionError(f"option vpn: {exc}") from None
    return url, read.text("token") or env.get("MESHPLANE_STREAMS_TOKEN"), vpn


def _topic_list(text: str | None) -> tuple[str, ...]:
    return tuple(t.strip() for t in (text or "").split(",") if t.strip())


def _parsed(text: str) -> Any:
    """The JSON value of ``text``; None when it is not JSON (the caller says what it expected)."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def _assignment(text: str | None) -> dict[str, tuple[int, ...]] | None:
    if text is None:
        return None
    raw = _parsed(text)
    if (
        not isinstance(raw, dict)
        or not raw
        or not all(isinstance(ps, list) and all(type(p) is int and p >= 0 for p in ps) for ps in raw.values())
    ):
        raise SparkOptionError(f'option assign must be JSON like {{"topic": [0, 1]}}, not {text!r}')
    return {str(t): tuple(sorted(set(ps))) for t, ps in raw.items()}


def _times(read: _Reader, every: str, by_partition: str) -> int | dict[str, dict[str, int]] | None:
    """``startingTimestamp`` (all partitions) wins over ``startingOffsetsByTimestamp``, as in Kafka."""
    single = read.integer(every, default=None, minimum=0)
    if single is not None:
        return single
    text = read.text(by_partition)
    if text is None:
        return None
    raw = _parsed(text)
    if not isinstance(raw, dict) or not all(
        isinstance(parts, dict) and all(type(t) is int and t >= 0 for t in parts.values())
        for parts in raw.values()
    ):
        raise SparkOptionError(
            f'option {by_partition} must be JSON like {{"topic": {{"0": 1700000000000}}}}, not {text!r}'
        )
    return {str(topic): {str(p): int(t) for p, t in parts.items()} for topic, parts in raw.items()}


def _reader_name(read: _Reader) -> str | None:
    """The ``readerName`` option, checked (None: each query notes its progress under its own name)."""
    given = read.text("readerName")
    if given and not _READER_NAME.fullmatch(given):
        raise SparkOptionError(f"option readerName must be 1-200 of A-Z a-z 0-9 _ . : - , not {given!r}")
    return given


def _options_reader_name(
    read: _Reader, topics: tuple[str, ...], pattern: str | None, assign: dict[str, tuple[int, ...]] | None
) -> str:
    """A name that stays the same across restarts of a query (a hash of what it reads and from where
    it starts): used only when a task cannot tell which query it belongs to."""
    what = json.dumps([topics, pattern, assign, read.text("startingOffsets")], sort_keys=True, default=list)
    return "spark-" + hashlib.sha256(what.encode()).hexdigest()[:12]


_READER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,199}")


def _choice(read: _Reader, name: str, allowed: tuple[str, ...]) -> str:
    value = (read.text(name) or allowed[0]).strip().lower()
    if value not in allowed:
        raise SparkOptionError(f"option {name} must be {' or '.join(allowed)}, not {value!r}")
    return value


def _offsets_text(read: _Reader, name: str, allowed: tuple[str, ...]) -> str | None:
    value = read.text(name)
    if value is None or value.strip().lower() in allowed:  # EARLIEST: Kafka lower-cases them too
        return None if value is None else value.strip().lower()
    try:
        json.loads(value)
    except ValueError:
        raise SparkOptionError(
            f'option {name} must be {" | ".join(allowed)} or JSON like {{"topic": {{"0": 5}}}}, not {value!r}'
        ) from None
    return value


@dataclass(frozen=True)
class Options:
    """The source's and sink's settings, from Spark's option map (see :meth:`for_source`)."""

    url: str = DEFAULT_URL
    token: str | None = None
    vpn: str | None = None  # an operator's choice of Message VPN (X-Meshplane-Vpn)
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    assign: dict[str, tuple[int, ...]] | None = None
    starting_offsets: str | None = None
    ending_offsets: str | None = None
    #: Milliseconds: one time for every partition, or {topic: {partition: time}}; wins over the offsets.
    starting_time: int | dict[str, dict[str, int]] | None = None
    ending_time: int | dict[str, dict[str, int]] | None = None
    #: What a starting time with no event at or after it means: "error" (Kafka's default) or "latest".
    starting_no_match: str = "error"
    max_events_per_trigger: int | None = None
    min_events_per_trigger: int | None = None
    max_trigger_delay: float = 900.0
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    include_headers: bool = False
    reader_name: str | None = (
        None  # where a streaming query records its progress ("": nowhere; None: its own)
    )
    default_reader_name: str = ""  # the fallback when a task cannot tell which query it belongs to
    columns: str = "kafka"  # or "legacy": the source's columns before Kafka's order was adopted
    # 2 MiB: a chunk and its columns stay near the cache (4 MiB read ~5% slower, 512 KiB ~15%)
    fetch_max_bytes: int = 2 << 20
    event_type: str = "spark"
    value_format: str = "strict"
    arrow: bool = True  # yield Arrow record batches (false: one tuple per row, slower; for comparison)
    local_reads: bool = True  # executors on the server's host read its segment files
    request_timeout: float = 60.0
    retry_timeout: float = 60.0
    ignored: tuple[str, ...] = ()  # Kafka's options given that do not apply (each warned about)
    projection: tuple[str, ...] | None = None  # the columns a user-given schema asks for, in its order

    @classmethod
    def for_source(cls, options: Mapping[str, Any]) -> Options:
        ignored = _check_names(options, SOURCE_OPTIONS, "source")
        read = _Reader(options)
        url, token, vpn = _server(read)
        topics = _topic_list(read.text("subscribe", "topics", "topic"))
        pattern = read.text("subscribePattern")
        assign = _assignment(read.text("assign"))
        chosen = [
            n
            for n, given in (("subscribe", topics), ("subscribePattern", pattern), ("assign", assign))
            if given
        ]
        if len(chosen) != 1:
            raise SparkOptionError(
                "set exactly one of subscribe (or topic), subscribePattern and assign"
                + (f"; got {', '.join(chosen)}" if chosen else "")
            )
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise SparkOptionError(
                    f"option subscribePattern is not a regular expression: {exc}"
                ) from None
        max_events = read.integer("maxOffsetsPerTrigger", "maxEventsPerTrigger", default=None, minimum=1)
        min_events = read.integer("minOffsetsPerTrigger", default=None, minimum=1)
        if min_events is not None and max_events is not None and min_events > max_events:
            raise SparkOptionError(
                f"option minOffsetsPerTrigger ({min_events}) is larger than "
                f"maxOffsetsPerTrigger ({max_events})"
            )
        return cls(
            url=url,
            token=token,
            vpn=vpn,
            topics=topics or tuple(assign or ()),
            topic_pattern=pattern,
            assign=assign,
            starting_offsets=_offsets_text(read, "startingOffsets", ("earliest", "latest")),
            ending_offsets=_offsets_text(read, "endingOffsets", ("earliest", "latest")),
            starting_time=_times(read, "startingTimestamp", "startingOffsetsByTimestamp"),
            ending_time=_times(read, "endingTimestamp", "endingOffsetsByTimestamp"),
            starting_no_match=_choice(read, "startingOffsetsByTimestampStrategy", ("error", "latest")),
            max_events_per_trigger=max_events,
            min_events_per_trigger=min_events,
            max_trigger_delay=read.duration("maxTriggerDelay", 900.0),
            fail_on_data_loss=read.boolean("failOnDataLoss", True),
            min_partitions=read.integer("minPartitions", default=None, minimum=1),
            include_headers=read.boolean("includeHeaders", False),
            columns=_choice(read, "columns", ("kafka", "legacy")),
            reader_name=_reader_name(read),
            default_reader_name=_options_reader_name(read, topics, pattern, assign),
            fetch_max_bytes=read.integer("fetchMaxBytes", default=2 << 20, minimum=1024) or 2 << 20,
            arrow=read.boolean("arrow", True),
            local_reads=read.boolean("localReads", True),
            request_timeout=(read.integer("requestTimeoutMs", default=60_000, minimum=1) or 60_000) / 1000,
            retry_timeout=(read.integer("retryTimeoutMs", default=60_000, minimum=0) or 0) / 1000,
            ignored=ignored,
        )

    def check_batch(self) -> None:
        """What Kafka refuses in a batch read: a start at the end, an end at the beginning."""
        if (self.starting_offsets or "").strip() == "latest" and self.starting_time is None:
            raise SparkOptionError(
                "option startingOffsets cannot be latest in a batch read (Kafka refuses it too)"
            )
        if (self.ending_offsets or "").strip() == "earliest" and self.ending_time is None:
            raise SparkOptionError(
                "option endingOffsets cannot be earliest in a batch read (Kafka refuses it too)"
            )
        for name, text, marker, what in (
            ("startingOffsets", self.starting_offsets, off.LATEST, "latest (-1)"),
            ("endingOffsets", self.ending_offsets, off.EARLIEST, "earliest (-2)"),
        ):
            marked = off.markers(text, marker)
            if marked:
                raise SparkOptionError(
                    f"option {name} cannot be {what} in a batch read (Kafka refuses it too): "
                    + ", ".join(marked)
                )

    def check_streaming(self) -> None:
        """A streaming query has no end: Kafka refuses the ending options in one, and so does this."""
        given = [
            name
            for name, value in (
                ("endingOffsets", self.ending_offsets),
                ("endingTimestamp / endingOffsetsByTimestamp", self.ending_time),
            )
            if value is not None
        ]
        if given:
            raise SparkOptionError(
                f"option {given[0]} is for batch reads; a streaming query has no end (Trigger.AvailableNow "
                "reads what is there and stops)"
            )

    @classmethod
    def for_sink(cls, options: Mapping[str, Any]) -> Options:
        ignored = _check_names(options, SINK_OPTIONS, "sink")
        read = _Reader(options)
        url, token, vpn = _server(read)
        value_format = _choice(read, "valueFormat", ("strict", "json"))
        topic = read.text("topic")
        return cls(
            url=url,
            token=token,
            vpn=vpn,
            topics=(topic.strip(),) if topic and topic.strip() else (),
            event_type=read.text("eventType") or "spark",
            value_format=value_format,
            request_timeout=(read.integer("requestTimeoutMs", default=60_000, minimum=1) or 60_000) / 1000,
            retry_timeout=(read.integer("retryTimeoutMs", default=60_000, minimum=0) or 0) / 1000,
            ignored=ignored,
        )
