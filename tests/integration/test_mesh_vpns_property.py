"""Message VPN isolation as a property (issue 58): hypothesis draws subscribers and publishers (each a
node of two clusters joined by gateways, a VPN, a user and its permissions, patterns with wildcards)
and every delivery is checked against a reference model: nothing reaches another VPN or a user whose
permissions deny it, but what that VPN exports and the receiver's imports (``SHARED``, renamed under
the import's prefix), and everything allowed arrives.

Completeness needs to know when everything has arrived: each client also subscribes to ``zz.>``
(last, so its other patterns are known wherever ``zz.>`` is; an importer its imported markers too),
publishers first send ``zz.warm`` until every subscriber of their VPN (or importing from it) has one
(their interest has reached the publisher's node), then their events, then ``zz.end``: events of one
publisher reach one subscriber in order (one path of ordered links), so once a subscriber has every
``zz.end`` it can get it has everything it will get."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplane.errors import PermissionDenied
from meshplane.mesh.client import MeshClient
from meshplane.mesh.vpns import hash_password
from tests.integration.test_mesh_gateways_guaranteed import TwoClusters, all_up, running
from tests.support.mesh import Inbox
from tests.unit.test_subjects import reference

WORDS = ("orders", "pay", "eu", "audit", "other")
UNIVERSE = [".".join(w) for n in range(1, 5) for w in itertools.product(WORDS, repeat=n)]
SUBJECTS = ("orders.eu", "orders.audit", "pay.eu", "pay.audit")
PATTERNS = (">", "#", "orders.>", "*.audit", "orders.eu", "pay.*", "*.*", "orders.eu.#")
NODES = ("a1", "a2", "b1", "b2")  # a1 and b1 are their clusters' gateways

# VPN X has users; Y and the default none. Every user may use zz.> (the test's markers).
USERS: dict[str, dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    "any": {},
    "orders": {"publish": (("orders.>", "zz.>"), ()), "subscribe": (("orders.>", "zz.>"), ())},
    "noaudit": {
        "publish": ((), ("orders.audit", "pay.audit")),
        "subscribe": ((), ("orders.audit", "pay.audit")),
    },
}
PASSWORD = "p-9d2e41"  # the test's own, for every user
# (exporter, importer) -> the importer's imports from it, (events, prefix); the markers (zz.>) too.
SHARED = {
    ("X", "Y"): (("pay.>", "x"), ("zz.>", "x")),
    ("Y", "default"): (("orders.>", ""), ("zz.>", "y")),
}
SHARING = """
[vpns.X]
exports = [{ events = "pay.>", to = ["Y"] }, { events = "zz.>" }]
[vpns.Y]
exports = [{ events = "orders.>" }, { events = "zz.>" }]
imports = [{ vpn = "X", events = "pay.>", prefix = "x" }, { vpn = "X", events = "zz.>", prefix = "x" }]
[vpns.default]
imports = [{ vpn = "Y", events = "orders.>" }, { vpn = "Y", events = "zz.>", prefix = "y" }]
"""


def subjects_of(pattern: str) -> set[str]:
    return {subject for subject in UNIVERSE if reference(pattern, subject)}


def may(user: str, direction: str, pattern: str) -> bool:
    """The reference model of permissions: sets of subjects, deny wins."""
    allow, deny = USERS.get(user, {}).get(direction, ((), ()))
    reached = subjects_of(pattern)
    covered = not allow or any(reached <= subjects_of(p) for p in allow)
    return covered and not any(reached & subjects_of(p) for p in deny)


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoClusters]:
    vpns = tmp_path_factory.mktemp("vpns") / "vpns.toml"
    lines = [SHARING]
    for user, rules in USERS.items():
        lines += [f"[vpns.X.users.{user}]", f'password_hash = "{hash_password(PASSWORD)}"']
        for direction, (allow, deny) in rules.items():
            lines.append(
                f"{direction} = {{ allow = {list(allow)!r}, deny = {list(deny)!r} }}".replace("'", '"')
            )
    vpns.write_text("\n".join(lines) + "\n")
    with running(TwoClusters(extra_args=("--mesh-vpns", str(vpns)))) as topo:
        asyncio.run(all_up(topo))
        yield topo


@dataclass(frozen=True)
class Party:
    node: str
    vpn: str
    user: str  # "" beyond VPN X


PARTIES = st.one_of(
    st.builds(Party, st.sampled_from(NODES), st.just("X"), st.sampled_from(sorted(USERS))),
    st.builds(Party, st.sampled_from(NODES), st.sampled_from(["Y", "default"]), st.just("")),
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(PARTIES, st.lists(st.sampled_from(PATTERNS), min_size=1, max_size=3)),
        min_size=1,
        max_size=4,
    ),
    st.lists(
        st.tuples(PARTIES, st.lists(st.sampled_from(SUBJECTS), min_size=1, max_size=4)),
        min_size=1,
        max_size=3,
    ),
)
def test_every_delivery_is_what_the_reference_model_allows(
    clusters: TwoClusters,
    subscribers: list[tuple[Party, list[str]]],
    publishers: list[tuple[Party, list[str]]],
) -> None:
    asyncio.run(run_example(clusters, subscribers, publishers))


async def connect(clusters: TwoClusters, party: Party) -> MeshClient:
    password = PASSWORD if party.user else None
    url = clusters[party.node].route_url
    errors: list[PermissionDenied] = []
    client = MeshClient(url, vpn=party.vpn, user=party.user, password=password, on_error=errors.append)
    REFUSALS[id(client)] = errors
    return await client.connect()


REFUSALS: dict[int, list[PermissionDenied]] = {}  # by client: what its node refused, not yet looked at


async def run_example(
    clusters: TwoClusters,
    subscribers: list[tuple[Party, list[str]]],
    publishers: list[tuple[Party, list[str]]],
) -> None:
    clients: list[MeshClient] = []
    try:
        inboxes = []
        for party, patterns in subscribers:
            client = await connect(clusters, party)
            clients.append(client)
            inbox = Inbox()
            inboxes.append(inbox)
            for pattern in patterns:
                client.subscribe(pattern, inbox)
            client.subscribe("zz.>", inbox)
            for (_, importer), shared in SHARED.items():
                if importer == party.vpn:
                    client.subscribe(renamed(shared[-1], "zz.>"), inbox)  # its imported markers
            refused = {str(e).split("'")[1] for e in await refusals(client)}
            assert refused == {p for p in patterns if not may(party.user, "subscribe", p)}, (party, patterns)
        senders = [await connect(clusters, party) for party, _ in publishers]
        clients += senders
        for number, (sender, (party, _)) in enumerate(zip(senders, publishers, strict=True)):
            await until_everyone_has(sender, f"warm-{number}", inboxes, subscribers, party.vpn, "zz.warm")
        for number, (sender, (party, subjects)) in enumerate(zip(senders, publishers, strict=True)):
            for subject in subjects:
                await sender.publish(subject, f"{number}:{subject}".encode())
            refused = {str(e).split("'")[1] for e in await refusals(sender)}
            assert refused == {s for s in subjects if not may(party.user, "publish", s)}, (party, subjects)
            await until_everyone_has(sender, f"end-{number}", inboxes, subscribers, party.vpn, "zz.end")
        for inbox, (party, patterns) in zip(inboxes, subscribers, strict=True):
            got = {body for _, body in inbox.events if not body.startswith((b"warm-", b"end-"))}
            allowed = {p for p in patterns if may(party.user, "subscribe", p)}
            expected = {
                f"{number}:{subject}".encode()
                for number, (sender, subjects) in enumerate(publishers)
                for subject in subjects
                if may(sender.user, "publish", subject)
                and any(
                    reference(p, seen) for p in allowed for seen in seen_as(sender.vpn, party.vpn, subject)
                )
            }
            assert got == expected, (party, patterns, publishers)
            markers = {
                int(body.split(b"-")[1]) for _, body in inbox.events if body.startswith((b"warm-", b"end-"))
            }
            assert all(reaches(publishers[number][0].vpn, party.vpn) for number in markers)
    finally:
        for client in clients:
            await client.close()


def renamed(shared: tuple[str, str], subject: str) -> str:
    return f"{shared[1]}.{subject}" if shared[1] else subject


def seen_as(sender: str, receiver: str, subject: str) -> set[str]:
    """The subjects an event of VPN ``sender`` on ``subject`` has in VPN ``receiver`` (none: it does
    not reach it): its own in its own VPN, renamed by each import that takes it."""
    seen = {subject} if sender == receiver else set()
    return seen | {
        renamed(s, subject) for s in SHARED.get((sender, receiver), ()) if reference(s[0], subject)
    }


def reaches(sender: str, receiver: str) -> bool:
    """Whether anything of VPN ``sender`` reaches VPN ``receiver`` (its markers do)."""
    return sender == receiver or (sender, receiver) in SHARED


async def refusals(client: MeshClient) -> list[PermissionDenied]:
    """What the node refused of what the client sent so far (answered before its flush)."""
    with contextlib.suppress(PermissionDenied):  # raised for the first of them: all are in on_error's
        await client.flush()
    errors = REFUSALS[id(client)]
    found, errors[:] = list(errors), []
    return found


async def until_everyone_has(
    sender: MeshClient,
    marker: str,
    inboxes: list[Inbox],
    subscribers: list[tuple[Party, list[str]]],
    vpn: str,
    subject: str,
) -> None:
    """``sender`` publishes ``marker`` on ``subject`` until every subscriber of ``vpn`` has it."""
    waiting = [
        inbox for inbox, (party, _) in zip(inboxes, subscribers, strict=True) if reaches(vpn, party.vpn)
    ]
    deadline = time.monotonic() + 30
    while not all(any(body == marker.encode() for _, body in inbox.events) for inbox in waiting):
        assert time.monotonic() < deadline, f"{marker} did not reach every subscriber of {vpn}"
        await sender.publish(subject, marker.encode())
        await asyncio.sleep(0.05)
