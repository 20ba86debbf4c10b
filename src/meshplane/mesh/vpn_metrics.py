"""Message VPNs on ``/metrics`` beyond their clients and refusals: their bytes in the spools, and what
crossed each import, read from the node at scrape time (``meshplane_mesh_vpn_*``)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from meshplane.mesh.node import MeshNode

PREFIX = "meshplane_mesh_vpn_"
IMPORT_LABELS = ["vpn", "from_vpn", "space"]  # the importing VPN, the exporter, the space as imported


class VpnCollector(Collector):
    def __init__(self, node: MeshNode) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        spooled = GaugeMetricFamily(
            PREFIX + "spool_bytes",
            "Bytes of a Message VPN's guaranteed events this node's spools hold for other nodes, unconfirmed",
            labels=["vpn"],
        )
        for vpn in sorted(self.node.config.vpns):
            spooled.add_metric([vpn], self.node.guaranteed.vpn_room.spooled_bytes(vpn))
        yield spooled
        imports = self.node.imports
        crossed = {
            "events": "Events of another VPN delivered through an import (one per subscriber here)",
            "requests": "Requests sent through a service import to the exporter's responders",
            "no_responders": "Requests through a service import that no responder of the exporter could take",
        }
        families = {
            what: CounterMetricFamily(f"{PREFIX}import_{what}", help_text, labels=IMPORT_LABELS)
            for what, help_text in crossed.items()
        }
        for row in imports.by_import():
            for what, family in families.items():
                family.add_metric([row["vpn"], row["from"], row["space"]], row[what])
        yield from families.values()
        replies = CounterMetricFamily(
            PREFIX + "import_replies",
            "Replies to requests through service imports, by outcome (replies: sent back to the requester)",
            labels=["outcome"],
        )
        for outcome in (
            "replies", "replies_unknown", "reply_tokens_expired", "reply_tokens_dropped_full",
            "reply_tokens_dropped_requester",
        ):  # fmt: skip
            replies.add_metric([outcome], imports.replies.counters[outcome])
        yield replies
        yield GaugeMetricFamily(
            PREFIX + "import_requests_open", "Requests through service imports awaiting their reply",
            value=len(imports.replies),
        )  # fmt: skip
