"""Mesh certificate identities (issue 54): a role and an identity in a SAN URI, compared byte for
byte; an earlier release's DNS-named certificates accepted as legacy, never a client's as a member."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.mesh.identity import Match, client_uri, match_client, match_member, member_uri


def cert(*uris: str, dns: tuple[str, ...] = (), cn: str = "") -> dict[str, Any]:
    return {
        "subject": ((("commonName", cn),),) if cn else (),
        "subjectAltName": tuple(("URI", u) for u in uris) + tuple(("DNS", d) for d in dns),
    }


def test_a_member_certificate_names_its_cluster_and_id_exactly() -> None:
    beta = cert(member_uri("c1", "beta"), dns=("beta.example",))
    assert match_member(beta, "c1", "beta") is Match.EXACT
    for cluster, node_id in (("c1", "BETA"), ("C1", "beta"), ("c2", "beta"), ("c1", "bet"), ("c1", "beta2")):
        assert match_member(beta, cluster, node_id, (node_id,)) is Match.MISMATCH


def test_a_client_certificate_never_proves_a_member() -> None:
    app = cert(client_uri("app1"), dns=("app1",), cn="app1")
    assert match_member(app, "c1", "app1", ("app1",)) is Match.CLIENT  # its DNS name is not looked at
    assert match_client(app) is Match.EXACT


def test_an_earlier_releases_certificate_is_legacy_and_compared_as_dns_names() -> None:
    old = cert(dns=("beta",), cn="k1")
    assert match_member(old, "c1", "beta", ("beta",)) is Match.LEGACY
    assert match_member(old, "c1", "k1", ("k1",)) is Match.LEGACY
    assert match_member(old, "c1", "BETA", ("BETA",)) is Match.LEGACY  # as that release did (DNS)
    assert match_member(old, "c1", "\u212a1", ("\u212a1",)) is Match.MISMATCH  # no Unicode folding
    assert match_client(old) is Match.LEGACY
    assert match_member({}, "c1", "beta", ("beta",)) is Match.MISMATCH


def test_other_uris_are_not_identities() -> None:
    web = cert("https://example.com/beta", dns=("beta",))
    assert match_member(web, "c1", "beta", ("beta",)) is Match.LEGACY
    other = cert("meshplane://admin/beta")
    assert match_member(other, "c1", "beta", ("beta",)) is Match.MISMATCH
    assert match_client(other) is Match.MISMATCH


@given(
    cluster=st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=8),
    node_id=st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=16),
    other=st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=16),
)
def test_only_the_exact_uri_matches(cluster: str, node_id: str, other: str) -> None:
    certificate = cert(member_uri(cluster, node_id))
    assert match_member(certificate, cluster, node_id) is Match.EXACT
    if member_uri(cluster, other) != member_uri(cluster, node_id):
        assert match_member(certificate, cluster, other) is Match.MISMATCH


@pytest.mark.parametrize("peercert", [None, {}])
def test_no_certificate_proves_nobody(peercert: dict[str, Any] | None) -> None:
    assert match_member(peercert, "c1", "a", ("a",)) is Match.MISMATCH
