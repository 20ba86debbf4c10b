"""The mesh's sans-I/O core: link frames, interest tables and anti-entropy, routing, dedup, queues."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.backpressure import SubscriberQueue
from meshplane.core.mesh.bloom import BloomFilter, BloomShape, pattern_key, subject_keys
from meshplane.core.mesh.dedup import DedupCache
from meshplane.core.mesh.frames import (
    ACKS_PER_FRAME,
    FLAG_BATCHED_ACKS,
    OVERHEAD,
    Frame,
    FrameError,
    FrameReader,
    FrameType,
    InterestChange,
    SyncResponse,
    batched_ack_sequences,
    check_node_id,
    encode_batched_ack,
    encode_event,
    encode_frame,
    encode_payload,
    event_id,
    event_parts,
)
from meshplane.core.mesh.interest import BUCKETS, OwnInterest, PeerInterest, decode_leaves, encode_leaves
from meshplane.core.mesh.interest_frames import (
    Changes,
    InterestBatch,
    Known,
    Refusal,
    interest_batch,
    interest_change,
    sync_answer,
    sync_reply,
)
from meshplane.core.mesh.router import Router, RouterLimits
from meshplane.core.subjects import matches

FRAMES = st.builds(
    lambda kind, flags, source, subject, seq, payload: (kind, flags, source, subject, seq, payload),
    st.sampled_from([t for t in FrameType if t is not FrameType.EVENT]),
    st.integers(0, 255),
    st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=16),
    st.text(max_size=50),
    st.integers(0, 2**64 - 1),
    st.binary(max_size=300),
)


@given(st.lists(FRAMES, max_size=10), st.data())
def test_frames_come_back_whole_however_the_stream_is_cut(
    frames: list[tuple[FrameType, int, str, str, int, bytes]], data: st.DataObject
) -> None:
    stream = b"".join(
        encode_frame(k, src, subj, seq, payload, flags) for k, flags, src, subj, seq, payload in frames
    )
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    reader = FrameReader()
    got: list[Frame | FrameError] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        got += reader.feed(stream[start:end])
        assert reader.pending == len(stream[:end]) - len(b"".join(f.raw for f in got if isinstance(f, Frame)))
    assert got == [Frame(k, flags, src, subj, seq, payload) for k, flags, src, subj, seq, payload in frames]


def test_the_layout_is_the_documented_one() -> None:
    frame = encode_frame(FrameType.SUB_ADD, "a", "x.y", 7, b"p", 0)
    assert len(frame) == OVERHEAD + 3 + 1
    assert frame[0] == 1
    assert frame[1] == 0
    assert frame[2:18] == b"a" + b"\x00" * 15
    assert frame[18:20] == b"\x00\x03"
    assert frame[20:23] == b"x.y"
    assert frame[23:31] == (7).to_bytes(8, "big")
    assert frame[31:35] == (1).to_bytes(4, "big")
    assert frame[35:36] == b"p"


@given(st.binary(max_size=200), st.data(), st.integers(1, 255))
def test_a_corrupted_frame_is_dropped_and_the_next_one_still_arrives(
    payload: bytes, data: st.DataObject, flip: int
) -> None:
    bad = bytearray(encode_frame(FrameType.EVENT, "a", "s", 1, b"\x00" * 8 + payload))
    lengths = {18, 19, 29, 30, 31, 32}  # subject and payload lengths: those break the stream (below)
    position = data.draw(st.sampled_from([i for i in range(len(bad)) if i not in lengths]))
    bad[position] ^= flip
    good = encode_frame(FrameType.HEARTBEAT, "b", "", 2, b"")
    out = FrameReader().feed(bytes(bad) + good)
    assert len(out) == 2
    assert isinstance(out[0], FrameError)
    assert out[0].reason == "checksum"
    assert out[1] == Frame(FrameType.HEARTBEAT, 0, "b", "", 2, b"")


def test_unknown_types_and_bad_text_are_reported_not_raised() -> None:
    frame = bytearray(encode_frame(FrameType.HELLO, "a", "s"))
    frame[0] = 99
    import zlib

    frame[-4:] = zlib.crc32(frame[:-4]).to_bytes(4, "big")
    [error] = FrameReader().feed(bytes(frame))
    assert isinstance(error, FrameError)
    assert error.reason == "unknown_type"


def test_an_oversized_length_breaks_the_stream_for_good() -> None:
    reader = FrameReader(max_payload=100)
    [error] = reader.feed(encode_frame(FrameType.EVENT, "a", "s", 1, b"\x00" * 200))
    assert isinstance(error, FrameError)
    assert error.fatal
    assert error.reason == "too_large"
    assert reader.feed(encode_frame(FrameType.HEARTBEAT, "a")) == []


def test_events_carry_their_timestamp_and_id() -> None:
    [frame] = FrameReader().feed(encode_event("node-a", "orders.eu", 42, 1703894400000, b"body"))
    assert isinstance(frame, Frame)
    assert event_parts(frame) == (1703894400000, b"body")
    assert event_id(frame) == "1703894400000-42-node-a"


@pytest.mark.parametrize("bad", ["", "x" * 17, "a\x00b", "tab\there"])
def test_node_ids_are_checked(bad: str) -> None:
    with pytest.raises(ValueError, match="node id"):
        check_node_id(bad)


# --- interest and anti-entropy -----------------------------------------------------------------------

PATTERN_POOL = [f"t{i}.{w}" for i in range(30) for w in ("x", "*", ">")]


def test_three_holders_make_one_add_and_the_last_one_out_one_remove() -> None:
    own = OwnInterest()
    assert own.add("payments") == 1
    assert own.add("payments") is None
    assert own.add("payments") is None
    assert own.remove("payments") is None
    assert own.remove("payments") is None
    assert own.remove("payments") == 2
    assert own.remove("payments") is None


@given(st.lists(st.tuples(st.booleans(), st.sampled_from(PATTERN_POOL), st.booleans()), max_size=200))
def test_digests_repair_a_copy_that_missed_updates(ops: list[tuple[bool, str, bool]]) -> None:
    """The owner's updates reach the copy or are lost (``delivered``); one digest round repairs it."""
    own, copy = OwnInterest(), PeerInterest()
    for add, pattern, delivered in ops:
        version = own.add(pattern) if add else own.remove(pattern)
        if version is not None and delivered:
            copy.apply(pattern, version, add)
    if copy.root() != own.root():
        buckets = own.answer(copy.leaves())
        assert buckets  # a differing root has differing leaves
        copy.replace(own.version, buckets)
    assert copy.patterns == set(own.holders)
    assert copy.root() == own.root()


def test_a_stale_update_never_undoes_a_newer_one() -> None:
    copy = PeerInterest()
    assert copy.apply("a", 5, True)
    assert copy.apply("a", 6, False)
    assert not copy.apply("a", 5, True)  # replayed add, older than the remove
    assert copy.patterns == set()
    assert copy.stale_ignored == 1
    copy.replace(10, {i: [] for i in range(BUCKETS)})
    assert not copy.apply("b", 9, True)  # older than the full answer for its bucket
    assert copy.apply("b", 11, True)
    assert copy.patterns == {"b"}


def test_an_answer_overtaken_by_a_newer_update_keeps_the_update() -> None:
    copy = PeerInterest()
    copy.apply("late", 12, True)
    _added, removed = copy.replace(10, {i: [] for i in range(BUCKETS)})
    assert copy.patterns == {"late"}
    assert removed == set()


def test_leaves_round_trip_and_bad_digests_are_refused() -> None:
    own = OwnInterest()
    own.add("a.b")
    leaves = PeerInterest().leaves()
    assert decode_leaves(encode_leaves(leaves)) == leaves
    with pytest.raises(ValueError, match="digest"):
        decode_leaves(b"short")


# --- routing -----------------------------------------------------------------------------------------

SUBJECT_WORDS = st.sampled_from(["t1", "t2", "x", "y"])


@given(
    st.lists(
        st.tuples(st.sampled_from(["local", "p1", "p2"]), st.sampled_from(PATTERN_POOL[:12])), max_size=30
    ),
    st.lists(SUBJECT_WORDS, min_size=1, max_size=4),
)
def test_routes_are_exactly_the_matching_holders_and_peers(
    interest: list[tuple[str, str]], words: list[str]
) -> None:
    router: Router[str] = Router(RouterLimits(bloom_filter_capacity=4, bloom_filter_fpr=0.5))
    router.add_peer("p1")
    router.add_peer("p2")
    for version, (who, pattern) in enumerate(interest, 1):
        if who == "local":
            router.subscribe(f"client-{version % 3}", pattern)
        else:
            router.apply(who, pattern, version, True)
    subject = ".".join(words)
    route = router.route(subject)
    assert route.local == {
        f"client-{v % 3}" for v, (who, p) in enumerate(interest, 1) if who == "local" and matches(p, subject)
    }
    assert set(route.peers) == {who for who, p in interest if who != "local" and matches(p, subject)}
    assert router.route(subject) is route  # cached until interest changes


@given(
    st.lists(st.tuples(st.booleans(), st.sampled_from(PATTERN_POOL[:8]), st.integers(1, 40)), max_size=40),
    st.lists(st.tuples(st.sampled_from(PATTERN_POOL[:8]), st.integers(1, 40)), max_size=8),
    st.lists(SUBJECT_WORDS, min_size=1, max_size=4),
)
def test_a_batch_of_changes_applies_as_the_changes_one_by_one(
    changes: list[tuple[bool, str, int]], before: list[tuple[str, int]], words: list[str]
) -> None:
    """An INTEREST frame's changes (stale ones, repeats, an add then its remove) leave a router as
    SUB_ADD / SUB_REMOVE frames of them would, and report the net difference as gained and lost."""
    one: Router[str] = Router(RouterLimits(bloom_filter_capacity=4, bloom_filter_fpr=0.5))
    many: Router[str] = Router(RouterLimits(bloom_filter_capacity=4, bloom_filter_fpr=0.5))
    subject = ".".join(words)
    for router in (one, many):
        router.add_peer("p")
        for pattern, version in before:
            router.apply("p", pattern, version, True)
        router.route(subject)  # cached: the batch must drop it where it changed
    held = set(many.peers["p"].interest.versions)
    for added, pattern, version in changes:
        one.apply("p", pattern, version, added)
    gained, lost = many.apply_many("p", [InterestChange(a, p, v) for a, p, v in changes])
    after = set(many.peers["p"].interest.versions)
    assert after == set(one.peers["p"].interest.versions)
    assert many.peers["p"].interest.versions == one.peers["p"].interest.versions
    assert (gained, lost) == (after - held, held - after)
    assert many.route(subject).peers == one.route(subject).peers
    assert set(many.route(subject).peers) == ({"p"} if any(matches(p, subject) for p in after) else set())


def test_an_interest_frame_is_checked_as_its_changes_would_be() -> None:
    known = Known(version=5, patterns=2, epoch=0, max_patterns=3)
    now = 10**18
    held = {"a.x", "a.y"}

    def batch(*changes: tuple[bool, str, int]) -> object:
        payload = encode_payload([InterestChange(*c) for c in changes])
        return interest_batch(payload, known, held, now)

    ok = [InterestChange(False, "a.x", 6), InterestChange(True, "b.1", 7), InterestChange(True, "b.2", 8)]
    assert batch((False, "a.x", 6), (True, "a..bad", 7), (True, "b.1", 7), (True, "b.2", 8)) == Changes(ok, 1)
    # One removed makes room for one more; a repeat or a held pattern takes none.
    assert batch((True, "b.1", 6), (True, "b.1", 7), (True, "a.y", 8)) == Changes(
        [InterestChange(True, "b.1", 6), InterestChange(True, "b.1", 7), InterestChange(True, "a.y", 8)], 0
    )
    assert batch((True, "b.1", 6), (True, "b.2", 7)) == Refusal("pattern_limit", close=True)
    assert batch((True, "b.1", 6), (False, "b.1", 7), (True, "b.2", 8)) == Changes(
        [InterestChange(True, "b.1", 6), InterestChange(False, "b.1", 7), InterestChange(True, "b.2", 8)], 0
    )
    # Versions may climb within a frame, each within the slack of the highest before it.
    assert isinstance(batch((False, "a.x", 5 + 10**6), (False, "a.y", 5 + 2 * 10**6)), Changes)
    assert batch((False, "a.x", 5 + 10**6 + 1)) == Refusal("version_jump", close=True)
    assert interest_batch(b"\xc1", known, held, now) == Refusal("bad_interest", close=False)
    too_many = encode_payload([InterestChange(False, "a.x", 6)] * 4097)
    assert interest_batch(too_many, known, held, now) == Refusal("interest_batch", close=True)
    frame = InterestBatch("a")
    for change in ok:
        frame.add(change)
    [decoded] = FrameReader().feed(frame.encode())
    assert isinstance(decoded, Frame)
    assert decoded.type is FrameType.INTEREST
    assert decoded.source == "a"
    assert interest_batch(decoded.payload, known, held, now) == Changes(ok, 0)


def test_a_tiny_filter_gives_false_positives_counted_never_a_wrong_route() -> None:
    router: Router[str] = Router(RouterLimits(bloom_filter_capacity=1, bloom_filter_fpr=0.9))
    router.add_peer("p")
    router.apply("p", "wanted", 1, True)
    routed = [s for s in (f"other{i}" for i in range(200)) if router.route(s).peers]
    assert routed == []
    assert router.bloom_false_positives["p"] > 0
    assert router.route("wanted").peers == ("p",)


def test_removing_interest_stops_routing_and_filters_are_rebuilt() -> None:
    router: Router[str] = Router()
    router.add_peer("p")
    for i in range(100):
        router.apply("p", f"s{i}", i + 1, True)
    for i in range(100):
        router.apply("p", f"s{i}", 200 + i, False)
    assert all(router.route(f"s{i}").peers == () for i in range(100))
    assert router.peers["p"].bloom.keys < 100  # rebuilt from what is left
    assert router.remote_subscriptions == 0


def test_a_removed_peer_takes_its_interest_with_it() -> None:
    router: Router[str] = Router()
    router.add_peer("p")
    router.apply("p", "a.>", 1, True)
    assert router.route("a.b").peers == ("p",)
    router.remove_peer("p")
    assert router.route("a.b").peers == ()


BLOOM_WORDS = ["a", "b"]
BLOOM_PATTERNS = [
    ".".join(tokens) + tail
    for size in range(1, 4)
    for tokens in itertools.product([*BLOOM_WORDS, "*"], repeat=size)
    for tail in ("", ".>")
] + [">"]
BLOOM_SUBJECTS = [
    ".".join(words) for size in range(1, 5) for words in itertools.product(BLOOM_WORDS, repeat=size)
]


def _found_by_bloom(pattern: str, subject: str) -> bool:
    bloom = BloomFilter(BloomShape(1000, 0.01))
    bloom.add(bloom.shape.positions(pattern_key(pattern)))
    return any(bloom.may_contain(bloom.shape.positions(k)) for k in subject_keys(subject))


def test_bloom_filters_find_every_matching_pair_of_the_small_pools() -> None:
    matching = [(p, s) for p in BLOOM_PATTERNS for s in BLOOM_SUBJECTS if matches(p, s)]
    assert len(matching) > 200  # the pools are built to match often: the check below is not vacuous
    assert [pair for pair in matching if not _found_by_bloom(*pair)] == []


@given(
    st.lists(st.sampled_from(["w1", "w2", "*"]), min_size=0, max_size=5),
    st.booleans(),
    st.data(),
)
def test_bloom_filters_have_no_false_negatives(tokens: list[str], tail: bool, data: st.DataObject) -> None:
    """The subject is built from the pattern, so every example reaches the assertion."""
    pattern = ".".join([*tokens, ">"] if tail else tokens or ["w1"])
    words = [data.draw(SUBJECT_WORDS) if t == "*" else t for t in pattern.split(".") if t != ">"]
    if tail:
        words += data.draw(st.lists(SUBJECT_WORDS, min_size=1, max_size=3))
    subject = ".".join(words)
    assert matches(pattern, subject)
    assert _found_by_bloom(pattern, subject)


# --- dedup and queues --------------------------------------------------------------------------------


def test_dedup_drops_a_repeat_within_the_ttl_and_stays_bounded() -> None:
    cache = DedupCache(per_topic=3, ttl_secs=10, topics=2)
    assert not cache.seen("t", (1, 1, "a", "p"), 0.0)
    assert cache.seen("t", (1, 1, "a", "p"), 5.0)
    assert not cache.seen("t", (1, 1, "a", "p"), 11.5)  # expired: a new event for all we know
    for i in range(10):
        cache.seen("t", (i, 0, "a", "p"), 20.0)
    for topic in ("u", "v", "w"):
        cache.seen(topic, (0, 0, "x", "p"), 20.0)
    assert len(cache) <= 3 * 2
    assert cache.duplicates == 1


def test_drop_newest_refuses_the_newcomer() -> None:
    queue: SubscriberQueue[int] = SubscriberQueue(3, 1000, "drop_newest")
    assert [queue.offer(i, 1) for i in range(5)] == [True, True, True, False, False]
    assert queue.take_all() == [0, 1, 2]
    assert queue.dropped == 2


def test_drop_oldest_makes_room() -> None:
    queue: SubscriberQueue[int] = SubscriberQueue(3, 1000, "drop_oldest")
    for i in range(5):
        queue.offer(i, 1)
    assert queue.take_all() == [2, 3, 4]
    assert queue.dropped == 2


def test_disconnect_marks_the_subscriber_for_closing() -> None:
    queue: SubscriberQueue[int] = SubscriberQueue(2, 1000, "disconnect")
    assert queue.offer(1, 1)
    assert queue.offer(2, 1)
    assert not queue.offer(3, 1)
    assert queue.overflowed
    assert queue.dropped == 1


def test_queues_are_bounded_in_bytes_too() -> None:
    queue: SubscriberQueue[str] = SubscriberQueue(100, 10, "drop_oldest")
    for item in ("aaaa", "bbbb", "cccc"):
        queue.offer(item, 4)
    assert queue.take_all() == ["bbbb", "cccc"]
    assert queue.bytes == 0
    assert not queue.offer("huge", 11)


def test_sync_responses_round_trip() -> None:
    from meshplane.core.mesh.frames import decode_sync, encode_payload

    response = SyncResponse(3, {1: ["a"], 5: []})
    assert decode_sync(encode_payload(response)) == response
    with pytest.raises(ValueError, match="malformed SYNC_RESP"):
        decode_sync(b"\xc1garbage")


def test_interest_frames_are_refused_alike_for_routes_and_gateways() -> None:
    known = Known(version=5, patterns=2, epoch=0, max_patterns=2)
    now = 10**18

    def change(kind: FrameType, subject: str, version: int) -> object:
        return interest_change(Frame(kind, 0, "b", subject, version, b""), known, now)

    assert change(FrameType.SUB_REMOVE, "a.*", 6) == "a.*"
    assert change(FrameType.SUB_ADD, "a..b", 6) == Refusal("bad_pattern", close=False)
    assert change(FrameType.SUB_REMOVE, "a.b", 5 + 10**6 + 1) == Refusal("version_jump", close=True)
    assert change(FrameType.SUB_ADD, "a.c", 6) == Refusal("pattern_limit", close=True)  # 2 held already
    own = OwnInterest()
    own.add("x.>")
    ping = sync_reply(Frame(FrameType.SYNC_REQ, 0, "b", "", 7, b""), "a", own)
    assert isinstance(ping, bytes)
    assert sync_reply(Frame(FrameType.SYNC_REQ, 0, "b", "", 1, b"\x01"), "a", own) == Refusal(
        "bad_digest", False
    )
    buckets = SyncResponse(6, {0: ["ok.x", "bad..x"]})
    assert sync_answer(encode_payload(buckets), known, now) == SyncResponse(6, {0: ["ok.x"]})
    too_many = SyncResponse(6, {0: ["a", "b", "c"]})
    assert sync_answer(encode_payload(too_many), known, now) == Refusal("pattern_limit", True)
    assert sync_answer(b"\xc1", known, now) == Refusal("bad_sync", False)


@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=ACKS_PER_FRAME))
def test_a_batched_ack_carries_each_number_back(sequences: list[int]) -> None:
    [frame] = FrameReader().feed(encode_batched_ack("node", sequences))
    assert isinstance(frame, Frame)
    assert frame.type is FrameType.ACK
    assert frame.flags & FLAG_BATCHED_ACKS
    assert batched_ack_sequences(frame) == tuple(sequences)


@pytest.mark.parametrize(("count", "payload"), [(2, b"\0" * 15), (3, b"\0" * 16), (1, b"")])
def test_a_batched_ack_whose_payload_is_not_its_count_of_numbers_is_refused(
    count: int, payload: bytes
) -> None:
    frame = encode_frame(FrameType.ACK, "node", sequence=count, payload=payload, flags=FLAG_BATCHED_ACKS)
    [decoded] = FrameReader().feed(frame)
    assert isinstance(decoded, Frame)
    with pytest.raises(ValueError, match="batched ACK"):
        batched_ack_sequences(decoded)


@given(
    st.lists(
        st.tuples(st.sampled_from("hij"), st.booleans(), st.sampled_from(["t1.x", "t1.*", "t2.>", "x.y"])),
        max_size=40,
    ),
    st.lists(st.integers(0, 40), max_size=6),
    st.lists(SUBJECT_WORDS, min_size=1, max_size=3),
)
def test_a_holders_changes_applied_at_once_are_what_one_by_one_makes(
    ops: list[tuple[str, bool, str]], cuts: list[int], words: list[str]
) -> None:
    """A holder's subscribes and unsubscribes (repeats, one withdrawn then taken again) applied in one
    :meth:`Router.change_holdings` leave the router, and a peer told what it announces, as the same
    applied one by one with :meth:`Router.subscribe` / :meth:`Router.unsubscribe`."""
    one: Router[str] = Router()
    many: Router[str] = Router()
    subject = ".".join(words)
    peer_one, peer_many = PeerInterest(), PeerInterest()
    for router in (one, many):
        router.route(subject)  # cached: applying must drop it where it changed
    for a, b in itertools.pairwise([0, *sorted(cuts), len(ops)]):
        turn: dict[str, list[tuple[bool, str]]] = {}
        for holder, added, pattern in ops[a:b]:
            turn.setdefault(holder, []).append((added, pattern))
            version = one.subscribe(holder, pattern) if added else one.unsubscribe(holder, pattern)
            if version is not None:
                peer_one.apply(pattern, version, added)
        for holder, changes in turn.items():
            held = set(many.patterns_of(holder))
            gained, lost, announced = many.change_holdings(holder, changes)
            after = many.patterns_of(holder)  # what it gained and lost, net, is what changed
            assert Counter(gained) - Counter(lost) == Counter(after - held)
            assert Counter(lost) - Counter(gained) == Counter(held - after)
            for added, pattern, version in announced:
                peer_many.apply(pattern, version, added)
        assert sorted(many.holdings()) == sorted(one.holdings())
        assert many.own.holders == one.own.holders
        assert many.route(subject).local == one.route(subject).local
        assert peer_many.patterns == peer_one.patterns == set(one.own.holders)
