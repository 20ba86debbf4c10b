"""Queue permissions (issue 58): who may create, bind and read a VPN's queues, by name patterns in
which '*' stands for any characters; checked against a regular expression as the reference, and in
the VPN file with each mistake at its line."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.mesh.identity import certificate_names
from meshplane.core.mesh.permissions import Permissions, Rules
from meshplane.core.mesh.queue_permissions import NameRules, QueueRules, check_name_pattern, name_matches
from meshplane.mesh.vpns import check_vpns, hash_password, parse_vpns

NAMES = st.text("ab-*", max_size=8)


def reference(pattern: str, name: str) -> bool:
    expression = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(expression, name, re.DOTALL) is not None


@given(NAMES, NAMES.map(lambda n: n.replace("*", "")))
def test_a_name_matches_a_pattern_as_the_reference_says(pattern: str, name: str) -> None:
    assert name_matches(pattern, name) is reference(pattern, name)


@given(st.lists(NAMES.filter(bool), max_size=3), st.lists(NAMES.filter(bool), max_size=3), NAMES)
def test_deny_wins_and_no_allow_allows_all(allow: list[str], deny: list[str], name: str) -> None:
    name = name.replace("*", "") or "q"
    reason = NameRules(tuple(allow), tuple(deny)).why_not("read", name)
    allowed = not any(reference(p, name) for p in deny) and (
        not allow or any(reference(p, name) for p in allow)
    )
    assert (reason == "") is allowed
    if not allowed:
        assert reason.startswith(f"read queue {name!r} ")


def test_binding_needs_the_queue_and_each_pattern_allowed() -> None:
    permissions = Permissions(
        subscribe=Rules(deny=("orders.audit.>",)),
        queues=QueueRules(
            create=NameRules(allow=("orders-*",)),
            bind=NameRules(deny=("orders-locked",)),
            read=NameRules(allow=("orders-*",), deny=("*-audit",)),
        ),
    )
    assert permissions.why_not_queue("create", "orders-eu") == ""
    assert permissions.why_not_queue("create", "payments") == (
        "permission denied: create queue 'payments' not allowed"
    )
    assert permissions.why_not_queue("bind", "orders-eu", ("orders.eu.>",)) == ""
    assert permissions.why_not_queue("bind", "orders-locked", ("orders.eu.>",)) == (
        "permission denied: bind queue 'orders-locked' denied by 'orders-locked'"
    )
    # a queue would keep for the user what its subscriptions may not get
    assert permissions.why_not_queue("bind", "orders-eu", ("orders.>",)) == (
        "permission denied: bind queue 'orders-eu': subscription to 'orders.>' could match subjects "
        "denied by 'orders.audit.>'"
    )
    assert permissions.why_not_queue("read", "orders-audit") == (
        "permission denied: read queue 'orders-audit' denied by '*-audit'"
    )
    assert Permissions().why_not_queue("create", "anything", (">",)) == ""


@pytest.mark.parametrize("pattern", ["", "a.b", "a>", "a b", "a/b", "x" * 256])
def test_what_cannot_match_a_queue_name_is_no_pattern(pattern: str) -> None:
    with pytest.raises(ValueError, match="not a queue name pattern"):
        check_name_pattern(pattern)


def test_queue_permissions_are_read_from_the_vpn_file() -> None:
    vpns = parse_vpns(
        f'[vpns.A.users.u]\npassword_hash = "{hash_password("pw")}"\n'
        'queues = { create = { allow = ["orders-*"] }, read = { deny = ["*-audit"] } }\n'
    )
    queues = vpns["A"].users["u"].queues
    assert queues == QueueRules(create=NameRules(allow=("orders-*",)), read=NameRules(deny=("*-audit",)))
    assert vpns["A"].users["u"].permissions().queues is queues


def test_every_mistake_of_queue_permissions_is_named_with_its_line() -> None:
    hashed = hash_password("pw")
    text = (
        f'[vpns.A.users.a]\npassword_hash = "{hashed}"\n'  # 1-2
        'queues = { delete = { allow = ["x"] } }\n'  # 3
        f'[vpns.A.users.b]\npassword_hash = "{hashed}"\n'  # 4-5
        'queues = { read = { allow = ["a.b"] } }\n'  # 6
        f'[vpns.A.users.c]\npassword_hash = "{hashed}"\n'  # 7-8
        "[vpns.A.users.c.queues.bind]\n"  # 9
        "allow = 3\n"  # 10
        f'[vpns.A.users.d]\npassword_hash = "{hashed}"\n'  # 11-12
        "queues = 1\n"  # 13
    )
    _, problems = check_vpns(text)
    assert [(p.line, p.where) for p in problems] == [
        (3, "[vpns.A.users.a]"),
        (6, "[vpns.A.users.b]"),
        (9, "[vpns.A.users.c]"),
        (13, "[vpns.A.users.d]"),
    ]
    assert "create, bind and read" in problems[0].message
    assert "'a.b' is not a queue name pattern" in problems[1].message
    assert "bind.allow must be a list" in problems[2].message


def test_a_certificates_names_are_its_common_name_and_each_alternative_name() -> None:
    peercert = {
        "subject": ((("organizationName", "acme"),), (("commonName", "alice"),)),
        "subjectAltName": (
            ("DNS", "alice.example"),
            ("URI", "meshplane://client/alice"),
            ("email", "alice@example.com"),
            ("IP Address", "10.0.0.1"),
            ("DirName", "ignored"),
        ),
    }
    assert certificate_names(peercert) == {
        "CN=alice",
        "DNS=alice.example",
        "URI=meshplane://client/alice",
        "email=alice@example.com",
        "IP=10.0.0.1",
    }
    assert certificate_names({}) == set()  # an unverified peer's (getpeercert() of no certificate)


def test_a_user_may_log_in_by_certificate_only_and_each_certificate_is_one_users() -> None:
    hashed = hash_password("pw")
    vpns = parse_vpns('[vpns.A.users.a]\ncertificate = "CN=alice"\n')
    alice = vpns["A"].users["a"]
    assert vpns["A"].by_certificate({"CN=alice", "DNS=x"}) == [alice]
    assert vpns["A"].by_certificate({"CN=Alice"}) == []  # byte for byte
    assert not alice.password_ok("")  # no password logs in as a certificate's user
    text = (
        '[vpns.A.users.a]\ncertificate = "CN=alice"\n'  # 1-2
        f'[vpns.A.users.b]\ncertificate = "CN=alice"\npassword_hash = "{hashed}"\n'  # 3-5
        '[vpns.A.users.c]\ncertificate = "O=acme"\n'  # 6-7
        "[vpns.A.users.d]\n"  # 8: neither a password nor a certificate
    )
    _, problems = check_vpns(text)
    assert [(p.line, p.where) for p in problems] == [
        (4, "[vpns.A.users.b]"),
        (7, "[vpns.A.users.c]"),
        (8, "[vpns.A.users.d]"),
    ]
    assert "is user 'a''s already" in problems[0].message
    assert "CN=..., DNS=..., email=..., URI=..., IP=..." in problems[1].message
    assert check_vpns('[vpns.A.users.e]\ncertificate = "CN"\n')[1][0].line == 2  # names nothing
    assert "unless the user logs in by its certificate" in problems[2].message
