"""Sharing between Message VPNs in the sans-I/O core (issue 58 item 4): pattern intersection, and an
exporter's event reaching an importer's holder exactly when it is exported to it and imported, under
the import's prefix, as a reference model says."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from meshplane.core.mesh.imports import Import, ImportInterest, intersect
from meshplane.core.mesh.replies import Replies
from meshplane.core.mesh.router import Router
from meshplane.core.mesh.vpn import DEFAULT, prefix_of
from meshplane.mesh.vpns import check_vpns
from tests.support.subjects import PATTERNS
from tests.unit.test_subjects import reference

CLIENT_PATTERNS = PATTERNS.filter(lambda p: not p.startswith("$"))
UNIVERSE = [".".join(w) for n in range(1, 6) for w in itertools.product(("a", "b", "c"), repeat=n)]


@given(CLIENT_PATTERNS, CLIENT_PATTERNS)
def test_the_intersection_of_two_patterns_matches_what_both_match(a: str, b: str) -> None:
    both = {s for s in UNIVERSE if reference(a, s) and reference(b, s)}
    met = intersect(a, b)
    assert ({s for s in UNIVERSE if reference(met, s)} if met else set()) == both
    # (A pattern met may match only subjects longer than the universe's: then ``both`` is empty too.)


VPNS = ("A", "B", DEFAULT)
SPACES = st.sampled_from(["a.>", "a.b", "b.*", "c.#", ">", "a.*.c"])
EXPORTS = st.lists(
    st.tuples(SPACES.filter(lambda s: s != ">"), st.sampled_from([(), (), (), ("B",), ("A", DEFAULT)])),
    max_size=2,
)
IMPORTS = st.lists(
    st.tuples(st.sampled_from(VPNS), SPACES, st.sampled_from(["", "x", "x.y", "a"])), max_size=2
)


def vpn_file(sharing: dict[str, tuple[list[tuple[str, tuple[str, ...]]], list[tuple[str, str, str]]]]) -> str:
    lines = []
    for name, (exports, imports) in sharing.items():
        lines.append(f"[vpns.{name}]")
        rendered = [{"events": events, "to": list(to)} for events, to in exports]
        lines.append(f"exports = [{', '.join(inline(e) for e in rendered)}]")
        rendered = [{"vpn": vpn, "events": events, "prefix": prefix} for vpn, events, prefix in imports]
        lines.append(f"imports = [{', '.join(inline(i) for i in rendered)}]")
    return "\n".join(lines) + "\n"


def inline(table: Mapping[str, object]) -> str:
    return "{ " + ", ".join(f"{key} = {json.dumps(value)}" for key, value in table.items()) + " }"


@st.composite
def shared(
    draw: st.DrawFn,
) -> dict[str, tuple[list[tuple[str, tuple[str, ...]]], list[tuple[str, str, str]]]]:
    """Exports, and imports mostly of what is exported (some of what is not, or only to others)."""
    exports = {name: draw(EXPORTS) for name in VPNS}
    imports: dict[str, list[tuple[str, str, str]]] = {name: [] for name in VPNS}
    for name in VPNS:
        for prefix in draw(st.lists(st.sampled_from(["", "x", "y.y", "x.x"]), unique=True, max_size=2)):
            exporters = [v for v in VPNS if v != name and exports[v]] or [v for v in VPNS if v != name]
            source = draw(st.sampled_from(exporters))
            offered = st.sampled_from([events for events, _ in exports[source]] or ["a.b"])
            events = draw(st.one_of(offered, offered, offered, st.just("b.*")))
            imports[name].append((source, events, prefix))
    return {name: (exports[name], imports[name]) for name in VPNS}


@settings(max_examples=300)
@given(
    shared(),
    st.lists(st.tuples(st.sampled_from(VPNS), CLIENT_PATTERNS), min_size=1, max_size=6),
    st.lists(st.tuples(st.sampled_from(VPNS), st.sampled_from(UNIVERSE)), min_size=1, max_size=8),
)
def test_an_event_reaches_an_importer_iff_exported_and_imported_under_its_prefix(
    sharing: dict[str, tuple[list[tuple[str, tuple[str, ...]]], list[tuple[str, str, str]]]],
    subscriptions: list[tuple[str, str]],
    published: list[tuple[str, str]],
) -> None:
    vpns, problems = check_vpns(vpn_file(sharing))
    if problems:  # what the file check refuses never runs; that it refuses the right files: below
        return
    interest = ImportInterest({name: vpn.imports for name, vpn in vpns.items() if vpn.imports})
    router: Router[object] = Router()
    for holder, (vpn, pattern) in enumerate(subscriptions):
        router.subscribe(holder, prefix_of(vpn) + pattern)
        for number, wanted in interest.subscribed(holder, vpn, prefix_of(vpn) + pattern):
            router.subscribe((holder, vpn, number), wanted)
    for vpn, subject in published:
        got: set[tuple[object, str]] = set()
        for reached in router.route(prefix_of(vpn) + subject).local:
            if isinstance(reached, tuple):  # an import holder: renamed into its importer's space
                target, importer, number = reached
                got.add((target, interest.imports[importer][number].renamed(subject)))
            else:
                got.add((reached, subject))
        expected: set[tuple[object, str]] = set()
        for holder, (vpn_of_holder, pattern) in enumerate(subscriptions):
            if vpn_of_holder == vpn and reference(pattern, subject):
                expected.add((holder, subject))
            exported = any(
                reference(events, subject) and (not to or vpn_of_holder in to)
                for events, to in sharing[vpn][0]
            )
            for source, events, prefix in sharing[vpn_of_holder][1]:
                renamed = f"{prefix}.{subject}" if prefix else subject
                if source == vpn and exported and reference(events, subject) and reference(pattern, renamed):
                    expected.add((holder, renamed))
        assert got == expected
    for holder, (vpn, pattern) in enumerate(subscriptions):  # given up: no interest is left behind
        router.unsubscribe(holder, prefix_of(vpn) + pattern)
        for number, wanted in interest.unsubscribed(holder, vpn, prefix_of(vpn) + pattern):
            router.unsubscribe((holder, vpn, number), wanted)
    assert router.holdings() == []


@given(st.fixed_dictionaries({name: st.tuples(EXPORTS, IMPORTS) for name in VPNS}))
def test_the_file_check_refuses_exactly_imports_not_exported_and_overlapping(
    sharing: dict[str, tuple[list[tuple[str, tuple[str, ...]]], list[tuple[str, str, str]]]],
) -> None:
    _, problems = check_vpns(vpn_file(sharing))
    expected = 0
    for name, (exports, imports) in sharing.items():
        locals_ = [f"{prefix}.{events}" if prefix else events for _, events, prefix in imports]
        for source, events, _prefix in imports:
            covered = any(
                {s for s in UNIVERSE if reference(events, s)} <= {s for s in UNIVERSE if reference(e, s)}
                and (not to or name in to)
                for e, to in sharing[source][0]
            )
            expected += source == name or not covered
        # intersect() is exact (above): imports that overlap, exports that meet an import
        expected += sum(intersect(a, b) is not None for n, a in enumerate(locals_) for b in locals_[:n])
        expected += sum(intersect(events, local) is not None for events, _ in exports for local in locals_)
    assert len(problems) == expected, [p.message for p in problems]


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("open"), st.integers(0, 5)),
            st.tuples(st.just("close"), st.integers(0, 40)),
            st.tuples(st.just("wait"), st.integers(0, 30)),
        ),
        max_size=60,
    )
)
def test_a_reply_token_answers_once_within_its_time_and_the_table_stays_bounded(
    steps: list[tuple[str, int]],
) -> None:
    """Against a model: each token opened answers its first close before its deadline, never again;
    the table never holds more than its capacity (the oldest dropped)."""
    replies = Replies(ttl=20.0, capacity=4)
    now = 0.0
    model: dict[str, tuple[str, float]] = {}  # token -> (reply, deadline), in order opened
    tokens: list[str] = []
    for step, value in steps:
        if step == "open":
            token = replies.open("B", f"_INBOX.{value}", now)
            assert token not in model
            assert "." not in token
            model = {t: d for t, d in model.items() if d[1] > now}
            while len(model) >= 4:
                del model[next(iter(model))]
            model[token] = (f"_INBOX.{value}", now + 20.0)
            tokens.append(token)
        elif step == "close" and tokens:
            token = tokens[value % len(tokens)]
            expected = model.pop(token, None)
            found = replies.close(token, now)
            assert found == (("B", expected[0]) if expected and expected[1] > now else None)
        else:
            now += value
        assert len(replies) <= 4


def test_a_service_import_sends_requests_under_its_prefix_only() -> None:
    service = Import("A", "svc.>", "math", service=True)
    assert service.request_to("math.svc.add") == "svc.add"
    assert service.request_to("math.other") is None
    assert service.request_to("svc.add") is None
    assert Import("A", "svc.add", service=True).request_to("svc.add") == "svc.add"
    assert Import("A", "svc.>", "math").request_to("math.svc.add") is None  # events do not take requests
    _, problems = check_vpns(
        '[vpns.A]\nexports = [{ events = "svc.>" }]\n'
        '[vpns.B]\nimports = [{ vpn = "A", service = "svc.>" }, { vpn = "A", events = "x", service = "y" }]\n'
    )
    assert [(p.line, p.message.split(" (")[0]) for p in problems] == [
        (4, 'one of events = "PATTERN"'),
        (4, "'A' exports no service covering 'svc.>' to 'B'"),
    ]


def test_one_vpns_flood_of_requests_drops_its_own_reply_tokens_not_anothers() -> None:
    """C's request waits for its answer while B floods the table: B's oldest go, C's answers."""
    replies = Replies(ttl=60.0, capacity=4)
    waiting = replies.open("C", "_INBOX.c", 0.0)
    flood = [replies.open("B", f"_INBOX.b{i}", 1.0) for i in range(10)]
    assert len(replies) == 4
    assert replies.close(waiting, 2.0) == ("C", "_INBOX.c")
    assert replies.close(flood[-1], 2.0) == ("B", "_INBOX.b9")
    assert replies.close(flood[0], 2.0) is None
    assert replies.counters["reply_tokens_dropped_full"] == 7


def test_one_clients_flood_of_requests_drops_its_own_reply_tokens_not_its_neighbours() -> None:
    """Two clients of B: the flooder's oldest tokens go, the other's request is still answered."""
    replies = Replies(ttl=60.0, capacity=100, per_requester=3)
    waiting = replies.open("B", "_INBOX.quiet", 0.0, "quiet")
    flood = [replies.open("B", f"_INBOX.f{i}", 1.0, "flooder") for i in range(50)]
    assert len(replies) == 4
    assert replies.close(waiting, 2.0) == ("B", "_INBOX.quiet")
    assert [replies.close(token, 2.0) for token in flood[-4:]] == [None] + [
        ("B", f"_INBOX.f{i}") for i in (47, 48, 49)
    ]
    assert replies.counters["reply_tokens_dropped_requester"] == 47
    assert replies.counters["reply_tokens_dropped_full"] == 0
