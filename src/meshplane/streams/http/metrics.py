"""Prometheus metrics, read from the service at scrape time."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from meshplane.core.mesh.vpn import DEFAULT, queue_topic
from meshplane.streams.grants import Grant
from meshplane.streams.http.params import GRANT, readable
from meshplane.streams.readers import Readers, reader_lag
from meshplane.streams.service import StreamsService

# --- metrics ---------------------------------------------------------------------------------------

REGISTRY: web.AppKey[CollectorRegistry] = web.AppKey("registry", CollectorRegistry)
_NAMED = re.compile(rb'(?:topic|room|group|queue)="((?:[^"\\]|\\.)*)"')
_VPN = re.compile(rb'[{,]vpn="((?:[^"\\]|\\.)*)"')


def readable_metrics(request: web.Request, exposition: bytes) -> bytes:
    """The exposition without the samples of names the request's token may not read, nor of VPNs
    other than its own (its operator's sees every VPN's)."""
    grant: Grant | None = request.get(GRANT)
    every_vpn = grant is None or grant.operator
    own = DEFAULT if grant is None else grant.vpn
    kept = []
    for line in exposition.split(b"\n"):
        if not every_vpn and not line.startswith(b"#"):
            vpn = _VPN.search(line)
            if (vpn[1].decode(errors="replace") if vpn else DEFAULT) != own:
                continue  # another VPN's sample (or, for a named VPN's token, the server's own)
        names = [match.decode(errors="replace") for match in _NAMED.findall(line)]
        if not names or len(readable(request, names)) == len(names):
            kept.append(line)
    return b"\n".join(kept)


class EngineCollector(Collector):
    """Reads the engine's counters at scrape time."""

    def __init__(
        self,
        engine: StreamsService,
        readers: Readers | None = None,
        *,
        vpn: str | None = None,
        refused: Mapping[str, int] | None = None,
        queue_vpns: Collection[str] = (),
    ) -> None:
        self.engine = engine
        self.readers = readers if readers is not None else Readers()
        self.vpn = vpn  # the Message VPN every sample is labelled with (None: no label, one VPN)
        self.refused = refused if refused is not None else {}  # answers its limits refused, by limit
        # The VPNs whose mesh queues' groups this (the default VPN's) service holds under stored names.
        self.queue_vpns = queue_vpns

    def collect(self) -> Any:
        for family in self._families():
            if self.vpn is not None:  # a sample of a VPN's queue group keeps its own VPN
                family.samples = [
                    s._replace(labels={**s.labels, "vpn": s.labels.get("vpn", self.vpn)})
                    for s in family.samples
                ]
            yield family

    def _group_owner(self, stored: str) -> tuple[str, str]:
        """The VPN and name of a group as its VPN's clients name it: a group made on a VPN's mesh
        queue is that VPN's (as its REST routes and commands see it), not the default VPN's."""
        vpn, _, name = stored.partition(":")
        group = self.engine.groups.get(stored)
        if (
            name
            and vpn in self.queue_vpns
            and group is not None
            and group.topic.startswith(queue_topic(vpn, ""))
        ):
            return vpn, name
        return self.vpn or DEFAULT, stored

    def _families(self) -> Any:
        e = self.engine
        for name, help_text in (
            ("events_published", "Events appended (rooms and topics)"),
            ("bytes_published", "Encoded bytes appended"),
            ("events_consumed", "Events read by consumers"),
            ("bytes_read_in_bulk", "Raw record bytes served or located for bulk readers (Spark)"),
            ("commits", "Offset commits accepted"),
            ("commits_rejected", "Offset commits rejected (stale generation, not owner)"),
            ("rebalances", "Consumer group rebalances"),
            ("duplicates_skipped", "Events of repeated idempotent publishes, not appended again"),
            ("room_events_unreadable", "Events in a room's JetStream stream that were not meshplane's"),
        ):
            yield CounterMetricFamily(f"meshplane_streams_{name}", help_text, value=e.counters[name])
        published = CounterMetricFamily(
            "meshplane_topic_events_published", "Events appended per partition", labels=["topic", "partition"]
        )
        end = GaugeMetricFamily(
            "meshplane_topic_next_offset", "Next offset per partition", labels=["topic", "partition"]
        )
        for topic in e.topics.values():
            for p, plog in enumerate(topic.partitions):
                published.add_metric([topic.name, str(p)], topic.published[p])
                end.add_metric([topic.name, str(p)], plog.next_offset)
        yield published
        yield end
        labels = ["group", "partition", "vpn"][: 2 if self.vpn is None else 3]  # vpn: its own, not ours
        lag = GaugeMetricFamily(
            "meshplane_group_lag", "Events not yet committed by a consumer group", labels=labels
        )
        for stored, p, value in e.lag():
            vpn, group = self._group_owner(stored)
            lag.add_metric([group, str(p), vpn][: len(labels)], value)
        yield lag
        reader_lags = GaugeMetricFamily(
            "meshplane_reader_lag",
            "Events not yet read by a reader that keeps its own position (a Spark query), as it last said",
            labels=["topic", "reader", "owner", "partition"],
        )
        for view in self.readers:
            read = e.topics.get(view.topic)
            if read is not None:
                for p, value in reader_lag(view, read.partitions).items():
                    reader_lags.add_metric([view.topic, view.name, view.owner, str(p)], value)
        yield reader_lags
        yield GaugeMetricFamily("meshplane_rooms", "Rooms", value=len(e.rooms))
        yield GaugeMetricFamily(
            "meshplane_room_live_subscribers",
            "Pushed room subscribers (WebSocket, SSE)",
            value=sum(len(r.pushers) for r in e.rooms.values()),
        )
        yield CounterMetricFamily(
            "meshplane_pubsub_dropped", "Pub/sub messages dropped for slow listeners", value=e.pubsub.dropped
        )
        yield CounterMetricFamily(
            "meshplane_pubsub_registrations_expired",
            "Pub/sub registrations dropped for not being renewed",
            value=e.pubsub.expired,
        )
        yield GaugeMetricFamily(
            "meshplane_storage_problems",
            "Corrupt records, tails and metadata found and set aside (GET /storage lists them)",
            value=len(e.storage_problems()),
        )
        yield CounterMetricFamily("meshplane_fsync_errors", "Failed fsyncs", value=e.durability.fsync_errors)
        yield GaugeMetricFamily("meshplane_open_segment_files", "Segment files open", value=len(e.files))
        used = GaugeMetricFamily("meshplane_limit_used", "Use of each configured limit", labels=["limit"])
        limit = GaugeMetricFamily("meshplane_limit", "Configured limits", labels=["limit"])
        for name, (value, most) in e.limits().items():
            used.add_metric([name], value)
            limit.add_metric([name], most)
        yield used
        yield limit
        refused = CounterMetricFamily(
            "meshplane_limits_refused", "Requests a configured limit refused (429)", labels=["limit"]
        )
        for name, count in sorted(self.refused.items()):
            refused.add_metric([name], count)
        yield refused
