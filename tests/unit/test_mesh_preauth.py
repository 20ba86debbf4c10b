"""What an unproven connection may cost (issue 54): the caps in all and per address, and log lines
bounded in size and rate."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.mesh.frames import PROTOCOL_VERSION, Hello, check_hello_ids, check_node_id
from meshplane.mesh.preauth import TEXT_IN_LOGS, QuietLog, Unproven, bounded


@given(st.text(max_size=5000))
def test_a_bounded_text_never_exceeds_its_bound(text: str) -> None:
    shown = bounded(text)
    assert len(shown) <= TEXT_IN_LOGS * 12 + 40  # a repr escapes a character to 10 at most
    assert (len(text) <= TEXT_IN_LOGS) == (shown == repr(text))


@given(st.lists(st.tuples(st.booleans(), st.sampled_from("abcd")), max_size=200))
def test_unproven_connections_stay_within_both_caps_the_oldest_making_room(
    steps: list[tuple[bool, str]],
) -> None:
    unproven: Unproven[int] = Unproven(limit=5, per_address=2)
    admitted: list[tuple[int, str]] = []  # oldest first
    for number, (opening, address) in enumerate(steps):
        if opening:
            refused, oldest = unproven.admit(number, address)
            if not refused:
                if len(admitted) == 5:  # full: the oldest one goes, the newcomer comes in
                    assert oldest == admitted.pop(0)[0]
                else:
                    assert oldest is None
                admitted.append((number, address))
            else:
                assert [a for _, a in admitted].count(address) == 2
        elif any(a == address for _, a in admitted):
            who = next(w for w, a in admitted if a == address)
            admitted = [(w, a) for w, a in admitted if w != who]
            unproven.done(who)
        assert unproven.count == len(admitted) <= 5
        addresses = [a for _, a in admitted]
        assert all(addresses.count(a) == unproven.by_address[a] <= 2 for a in set(addresses))


def test_a_quiet_log_says_one_line_a_second_and_counts_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    quiet = QuietLog(logging.getLogger("test.quiet"), interval=3600)
    with caplog.at_level(logging.WARNING):
        for _ in range(1000):
            quiet.warning("kind", "refused %s", "x")
        quiet.warning("other", "another kind")
    assert [r.getMessage() for r in caplog.records] == ["refused x", "another kind"]
    quiet._last["kind"] = -1e9  # the interval has passed
    with caplog.at_level(logging.WARNING):
        quiet.warning("kind", "refused %s", "y")
    assert caplog.records[-1].getMessage() == "refused y (and 999 more like it)"


@pytest.mark.parametrize("node_id", ["", "x" * 17, "\u212a1", "BETA\x00", "tab\there"])
def test_node_ids_are_printable_ascii_of_at_most_16(node_id: str) -> None:
    with pytest.raises(ValueError, match="printable ASCII"):
        check_node_id(node_id)


@pytest.mark.parametrize(
    ("node", "cluster"), [("n" * 65, "c"), ("n", "c" * 65), ("\u212a", "c"), ("n", "\xe9")]
)
def test_hello_ids_are_printable_ascii_of_at_most_64(node: str, cluster: str) -> None:
    with pytest.raises(ValueError, match="ASCII"):
        check_hello_ids(Hello(PROTOCOL_VERSION, node, cluster, "client"))
    check_hello_ids(Hello(PROTOCOL_VERSION, "n" * 64, "c" * 64, "client"))
