"""A VPN left out of DMR (``dmr = false``) keeps everything of its own in its cluster, also what the
mesh wraps: a retained message's ``$mqtt.`` subject and a queue group's ``$NQ.G.`` / ``$MQ.G.`` marker
(whose inner pattern carries the VPN's prefix); other VPNs' cross as before."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.doors.mqtt_topics import RETAIN_PREFIX
from meshplane.core.doors.nats_groups import MARK, MQTT_MARK, marker, unmarked
from meshplane.core.mesh.vpn import DEFAULT, prefix_of, vpn_of
from meshplane.mesh.gateways import Gateways
from meshplane.mesh.vpns import Vpn

tokens = st.text("abc*", min_size=1, max_size=3).filter(lambda t: "*" not in t or t == "*")
patterns = st.lists(tokens, min_size=1, max_size=4).map(".".join)
vpns = st.sampled_from([DEFAULT, "L", "A-1"])
groups = st.text("abz_-09", min_size=1, max_size=6)


@given(vpns, groups, patterns, st.sampled_from([MARK, MQTT_MARK]))
def test_a_markers_inner_pattern_keeps_its_vpn(vpn: str, group: str, pattern: str, mark: str) -> None:
    inner = prefix_of(vpn) + pattern
    assert unmarked(marker(group, inner, mark)) == inner
    assert vpn_of(unmarked(marker(group, inner, mark))) == vpn


@given(vpns, patterns)
def test_what_is_no_marker_is_left_as_it_is(vpn: str, pattern: str) -> None:
    subject = prefix_of(vpn) + pattern
    assert unmarked(subject) == subject
    assert unmarked("$NQ") == "$NQ"


def crossing(subject: str) -> bool:
    gateways = Gateways.__new__(Gateways)
    gateways.node = SimpleNamespace(config=SimpleNamespace(vpns={"L": Vpn("L", dmr=False), "A": Vpn("A")}))  # type: ignore[assignment]
    return gateways.crosses(subject)


@given(groups, patterns, st.sampled_from([MARK, MQTT_MARK]))
def test_a_vpn_out_of_dmr_keeps_its_group_markers_and_retained_in_its_cluster(
    group: str, pattern: str, mark: str
) -> None:
    assert not crossing(prefix_of("L") + pattern)
    assert not crossing(RETAIN_PREFIX + prefix_of("L") + pattern)
    assert not crossing(marker(group, prefix_of("L") + pattern, mark))
    assert crossing(marker(group, prefix_of("A") + pattern, mark))
    assert crossing(marker(group, pattern, mark))  # the default VPN's
    assert crossing(RETAIN_PREFIX + pattern)
