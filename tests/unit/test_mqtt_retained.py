"""The MQTT door's retained messages: each VPN's own share of the node's pool (docs/security.md)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.mesh.vpn import prefix_of
from meshplane.mesh.doors.mqtt_retained import RetainedStore

A, B = prefix_of("team-a"), prefix_of("team-b")


def test_one_vpn_filling_its_share_leaves_another_vpns_share_whole() -> None:
    store = RetainedStore(max_count=100, max_bytes=10_000, vpns=lambda: 2)
    filled = sum(store.put(f"{A}r.{i}", b"x", 0) is not None for i in range(1000))
    assert filled == 50  # half the pool: two VPNs
    assert store.refused == {"team-a": 950}
    assert all(store.put(f"{B}r.{i}", b"y", 1) for i in range(50))  # team-b's share is untouched
    assert not store.put(f"{B}r.50", b"y", 1)
    assert store.refused == {"team-a": 950, "team-b": 1}
    assert store.put(f"{A}r.0", b"", 0)  # an empty payload clears: room again
    assert store.put(f"{A}r.new", b"x", 0)


def test_a_vpns_share_is_bounded_in_bytes_too() -> None:
    store = RetainedStore(max_count=100, max_bytes=1000, vpns=lambda: 2)
    assert store.put(f"{A}big", b"x" * 400, 0)
    assert not store.put(f"{A}big2", b"x" * 200, 0)  # 500 bytes per VPN
    assert store.put(f"{B}big", b"x" * 400, 0)
    assert store.put(f"{A}big", b"x" * 450, 0)  # a topic's new message replaces its old one
    assert store.usage("team-a") == (1, 450 + len(f"{A}big"))


def test_a_default_vpn_alone_has_the_whole_pool() -> None:
    store = RetainedStore(max_count=10, max_bytes=10_000, vpns=lambda: 1)
    assert sum(store.put(f"r.{i}", b"x", 0) is not None for i in range(20)) == 10


def test_matching_never_crosses_vpns() -> None:
    store = RetainedStore(vpns=lambda: 3)
    store.put(f"{A}r.1", b"a", 0)
    store.put("r.1", b"default", 0)
    assert [s for s, _ in store.candidates(f"{B}r.*")] == []
    assert [s for s, _ in store.candidates(f"{A}#")] == [f"{A}r.1"]
    assert [s for s, _ in store.candidates("#")] == ["r.1"]  # the default VPN's '#' is its own


@given(st.lists(st.tuples(st.sampled_from(["", A, B]), st.integers(0, 30), st.binary(max_size=40))))
def test_the_counts_and_bytes_always_add_up(puts: list[tuple[str, int, bytes]]) -> None:
    store = RetainedStore(max_count=20, max_bytes=600, vpns=lambda: 3)
    for prefix, topic, payload in puts:
        store.put(f"{prefix}t.{topic}", payload, 0)
        for vpn in ("default", "team-a", "team-b"):
            count, size = store.usage(vpn)
            assert count <= 20 // 3
            assert size <= 600 // 3
    assert sum(store.usage(v)[0] for v in ("default", "team-a", "team-b")) == store.count
    assert sum(store.usage(v)[1] for v in ("default", "team-a", "team-b")) == store.total_bytes
