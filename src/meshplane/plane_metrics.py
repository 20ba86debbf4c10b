"""The event plane's Prometheus metrics (``meshplane_plane_*``), read from a plane's members at scrape
time, and the optional ``/metrics`` endpoint of a plane process (``MESHPLANE_METRICS_PORT``).

prometheus-client comes with ``meshplane[streams]``; only this module imports it, and the plane imports
this module only when an endpoint is asked for, so the event plane runs without it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from meshplane.core.tally import OTHER, Count
from meshplane.errors import ConfigError
from meshplane.subscriber import EventSubscriber

if TYPE_CHECKING:
    from meshplane.plane import EventPlane

_PER_PUBLISHER = (
    ("events", Count.EVENTS, "Events delivered to subscribers"),
    ("gaps", Count.GAPS, "Runs of missing events reported (EventGap)"),
    ("missing", Count.MISSING, "Events reported missing (lost on the way, head or tail included)"),
    ("duplicates", Count.DUPLICATES, "Copies of delivered events, dropped"),
)
_PER_TOPIC = (
    ("joined_late", "joined_late", "Events sent before the subscriber joined (not lost)"),
    ("heartbeats", "heartbeats", "Heartbeats received"),
    ("timeouts", "timeouts", "Publishers reported silent (EventTimeout)"),
    ("publishers_left", "publishers_left", "Publishers that closed cleanly (their goodbye arrived)"),
)


class PlaneCollector:
    """Counts of ``plane``'s subscribers by scope and topic (summed over the subscribers of one topic),
    by publisher for the ``publishers`` with the most events (the rest as ``publisher="other"``), drops
    by reason, and what its publishers published."""

    def __init__(self, plane: EventPlane, publishers: int) -> None:
        self.plane = plane
        self.publishers = publishers

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        per_publisher: dict[tuple[str, str, str], list[int]] = {}
        per_topic: dict[tuple[str, str], Counter[str]] = {}
        dropped: Counter[tuple[str, str, str]] = Counter()
        published: Counter[tuple[str, str]] = Counter()
        unrouted: Counter[tuple[str, str]] = Counter()
        for member in self.plane.members:
            where = (str(member.scope), member.topic)
            if not isinstance(member, EventSubscriber):
                published[where] += member.next_sequence
                unrouted[where] += member.unrouted
                continue
            for publisher_id, row in member.publisher_counts(self.publishers):
                label = "other" if publisher_id == OTHER else f"{publisher_id:x}"
                sums = per_publisher.setdefault((*where, label), [0] * len(Count))
                for i, value in enumerate(row):
                    sums[i] += value
            stats = member.stats
            per_topic.setdefault(where, Counter()).update(
                {key: getattr(stats, key) for _, key, _ in _PER_TOPIC}
            )
            for reason, n in {**stats.drops, **stats.malformed}.items():
                dropped[(*where, reason)] += n
            dropped[(*where, "after_leave")] += stats.after_leave
        for name, count, text in _PER_PUBLISHER:
            family = CounterMetricFamily(
                f"meshplane_plane_{name}", text, labels=["scope", "topic", "publisher"]
            )
            for labels, row in per_publisher.items():
                family.add_metric(labels, row[count])
            yield family
        for name, key, text in _PER_TOPIC:
            family = CounterMetricFamily(f"meshplane_plane_{name}", text, labels=["scope", "topic"])
            for where, counts in per_topic.items():
                family.add_metric(where, counts[key])
            yield family
        family = CounterMetricFamily(
            "meshplane_plane_dropped",
            "Messages dropped before delivery, by reason: queue_full (the subscriber's queue), "
            "slow_consumer (nats-py's), after_leave, or a wire error's reason (malformed, truncated...)",
            labels=["scope", "topic", "reason"],
        )
        for labels, n in dropped.items():
            family.add_metric(labels, n)
        yield family
        family = CounterMetricFamily(
            "meshplane_plane_published", "Events published (sequences taken)", labels=["scope", "topic"]
        )
        for where, n in published.items():
            family.add_metric(where, n)
        yield family
        family = CounterMetricFamily(
            "meshplane_plane_unrouted",
            "Events published while no subscription had reached the publisher (ZeroMQ drops them in its "
            "socket: a slow joiner, or in broker mode the hop to the brokers)",
            labels=["scope", "topic"],
        )
        for where, n in unrouted.items():
            family.add_metric(where, n)
        yield family


class MetricsEndpoint:
    """``/metrics`` on ``host:port`` (0: a free port) for one plane, in a thread of its own."""

    def __init__(self, plane: EventPlane, host: str, port: int, publishers: int) -> None:
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            raise ConfigError(
                "MESHPLANE_METRICS_PORT needs prometheus-client: pip install 'meshplane[streams]'"
            ) from None
        registry = CollectorRegistry()
        registry.register(PlaneCollector(plane, publishers))
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            where = f"{host}:{port} (MESHPLANE_METRICS_HOST, MESHPLANE_METRICS_PORT)"
            raise ConfigError(f"cannot serve metrics on {where}: {exc}") from None
        self.host, self.port = host, self._server.server_port
        self._stopped = threading.Event()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        if not self._stopped.is_set():
            self._stopped.set()
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)
