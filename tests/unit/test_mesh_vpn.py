"""Message VPNs in the sans-I/O core (issue 58): prefixes, and isolation as a property of the routing
table against a reference model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.mesh.router import Router
from meshplane.core.mesh.vpn import DEFAULT, bound_role, check_vpn, outward, prefix_of, queue_topic, vpn_of
from meshplane.errors import ConfigError
from meshplane.mesh.queues import PREFIX
from meshplane.mesh.vpns import check_vpns, hash_password, parse_vpns
from tests.support.subjects import PATTERNS
from tests.unit.test_subjects import reference

VPNS = st.sampled_from([DEFAULT, "A", "B", "G"])  # "G": a VPN named as $G's token
CLIENT_WORDS = st.sampled_from(["a", "b", "c"])  # what a client may publish on: no '$' first token
SUBJECTS = st.lists(CLIENT_WORDS, min_size=1, max_size=5).map(".".join)
CLIENT_PATTERNS = PATTERNS.filter(lambda p: not p.startswith("$"))


def test_vpn_names_and_prefixes() -> None:
    assert prefix_of(DEFAULT) == ""
    assert prefix_of("A") == "$vpn:A."
    assert vpn_of("$vpn:team-a.orders.eu") == "team-a"
    assert vpn_of("orders.eu") == DEFAULT
    assert vpn_of("$vpn:A") == "A"
    assert outward("$vpn:A.", "$vpn:A.orders.eu") == "orders.eu"
    assert queue_topic(DEFAULT, "orders") == "orders"
    assert queue_topic("A", "orders") == "A:orders"
    assert bound_role("client", "") == bound_role("client", DEFAULT) == "client"  # the default's bytes
    assert bound_role("client", "A") == "client@A"
    for bad in ("", "-a", "a.b", "a b", "$a", "x" * 33, "a:b"):
        with pytest.raises(ValueError, match="VPN name"):
            check_vpn(bad)
    assert check_vpn("team_a-1") == "team_a-1"


@given(
    st.lists(st.tuples(VPNS, CLIENT_PATTERNS), min_size=1, max_size=8),
    st.lists(st.tuples(VPNS, CLIENT_PATTERNS), max_size=4),
    st.lists(st.tuples(VPNS, CLIENT_PATTERNS), max_size=4),
    st.lists(st.tuples(VPNS, SUBJECTS), min_size=1, max_size=8),
)
def test_events_reach_exactly_the_holders_peers_and_queues_of_their_vpn(
    local: list[tuple[str, str]],
    remote: list[tuple[str, str]],
    queues: list[tuple[str, str]],
    published: list[tuple[str, str]],
) -> None:
    """Subscribers here, a peer's interest and queues (``$G.``), each in a VPN: an event published in
    a VPN reaches exactly those of its VPN whose pattern the reference model says matches."""
    router: Router[int] = Router()
    router.add_peer("p")
    for holder, (vpn, pattern) in enumerate(local):
        router.subscribe(holder, prefix_of(vpn) + pattern)
    for version, (vpn, pattern) in enumerate(remote, 1):
        router.apply("p", prefix_of(vpn) + pattern, version, True)
    first_queue = len(local)
    for queue, (vpn, pattern) in enumerate(queues, first_queue):
        router.subscribe(queue, PREFIX + prefix_of(vpn) + pattern)
    for vpn, subject in published:
        route = router.route(prefix_of(vpn) + subject)
        assert set(route.local) - set(range(first_queue, first_queue + len(queues))) == {
            holder for holder, (v, p) in enumerate(local) if v == vpn and reference(p, subject)
        }
        assert ("p" in route.peers) == any(v == vpn and reference(p, subject) for v, p in remote)
        guaranteed = router.route(PREFIX + prefix_of(vpn) + subject)
        assert set(guaranteed.local) == {
            queue for queue, (v, p) in enumerate(queues, first_queue) if v == vpn and reference(p, subject)
        }


def test_the_vpn_file_says_each_mistake() -> None:
    vpns = parse_vpns(
        '[vpns.A.users.alice]\npassword_hash = "$argon2id$h4sh"\npublish = { deny = ["a.>"] }\n'
    )
    assert sorted(vpns) == ["A", DEFAULT]
    assert vpns["A"].users["alice"].publish.deny == ("a.>",)
    assert "h4sh" not in repr(vpns["A"].users["alice"])  # the hash is not shown
    for text, message in (
        ("[vpns.-a]", "VPN name"),
        ("[other]", "unknown key"),
        ("[vpns.A]\nlimit = 3", "unknown key"),
        ("[vpns.A]\nmax_topics = 0", "max_topics: a whole number"),
        ('[vpns.A]\nmax_groups = "10"', "max_groups: a whole number"),
        ('[vpns.A.users.u]\npassword_hash = "plain"', "argon2 hash"),
        ('[vpns.A.users.u]\npassword_hash = "$argon2id$x"\nsubscribe = { allow = ["a..b"] }', "not a valid"),
        ('[vpns.A.users.u]\npassword_hash = "$argon2id$x"\npublish = { only = [] }', "allow and deny"),
        ("[vpns", "not TOML"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_vpns(text)


def test_a_password_is_checked_against_its_argon2_hash() -> None:
    user = parse_vpns(f'[vpns.A.users.u]\npassword_hash = "{hash_password("right")}"').by_name["A"].users["u"]
    assert user.password_ok("right")
    assert not user.password_ok("wrong")
    broken = parse_vpns('[vpns.A.users.u]\npassword_hash = "$argon2id$broken"').by_name["A"].users["u"]
    assert not broken.password_ok("right")


def test_the_vpn_file_of_the_docs_is_one() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "mesh.md").read_text()
    (snippet,) = re.findall(r"```toml vpns.toml\n(.*?)```", docs, re.DOTALL)
    vpns = parse_vpns(snippet)
    assert vpns["team-a"].users["alice"].subscribe.deny == ("orders.audit.>",)
    assert vpns["team-a"].max_connections == 100
    assert vpns["team-a"].streams_limits() == {"max_topics": 1000}
    assert vpns["team-b"].streams_limits() == {}
    assert [i.local for i in vpns["team-b"].imports] == ["a.orders.eu.>", "a.prices.>"]


def test_every_mistake_of_a_vpn_file_is_named_with_its_line() -> None:
    text = (
        "[vpns.A]\n"  # 1
        "max_connections = 0\n"  # 2
        "[vpns.A.users.alice]\n"  # 3
        'password_hash = "plain"\n'  # 4
        'subscribe = { allow = ["a..b"] }\n'  # 5
        "[vpns.-b]\n"  # 6
        "[vpns.C]\n"  # 7
        "colour = 1\n"  # 8
        "[vpns.D]\n"  # 9
    )
    vpns, problems = check_vpns(text)
    assert [(p.line, p.where) for p in problems] == [
        (2, "[vpns.A]"),
        (4, "[vpns.A.users.alice]"),
        (5, "[vpns.A.users.alice]"),
        (6, "[vpns.-b]"),
        (8, "[vpns.C]"),
    ]
    assert "a..b" in problems[2].message
    assert "colour" in problems[4].message
    assert sorted(vpns) == ["D", DEFAULT]  # the VPNs without mistakes
    with pytest.raises(ConfigError, match=r"^f.toml:2: \[vpns.A\]: max_connections.* and 4 more"):
        parse_vpns(text, "f.toml")
    assert check_vpns("[vpns.A]\nx = 1 2\n")[1][0].line == 2  # TOML's own errors keep their line
