import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane import ConfigError, InvalidDiscoveryRecord, PlaneConfig
from meshplane.core.brokers import (
    BrokerAddress,
    DedupCache,
    broker_record,
    parse_broker_record,
    parse_broker_url,
    select_brokers,
)


def test_the_seeds_url_format():
    assert parse_broker_url("xsub=tcp://broker:5555 , xpub=tcp://broker:5556") == (
        BrokerAddress("tcp://broker:5555", "tcp://broker:5556"),
    )
    assert parse_broker_url(" xpub=tcp://b1:6;tcp://b2:6 ,xsub= tcp://b1:5 ; tcp://b2:5 ") == (
        BrokerAddress("tcp://b1:5", "tcp://b1:6"),
        BrokerAddress("tcp://b2:5", "tcp://b2:6"),
    )


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("tcp://broker:5555", "is not xsub=... or xpub=..."),
        ("xsub=tcp://a:1", "xpub= is missing"),
        ("xpub=tcp://a:1", "xsub= is missing"),
        ("xsub=tcp://a:1 , xpub=", "xpub= names no endpoint"),
        ("xsub=tcp://a:1;tcp://b:1 , xpub=tcp://a:2", "2 xsub endpoints but 1 xpub"),
        ("xsub=broker:5555 , xpub=tcp://a:2", "'broker:5555' is not tcp://host:port"),
        ("xsub=tcp://a:1 , xsub=tcp://a:1", "xsub is given twice"),
        ("xsub=tcp://a:1 , pub=tcp://a:2", "'pub=tcp://a:2'"),
    ],
)
def test_bad_urls_name_the_bad_part(url, message):
    with pytest.raises(ConfigError, match=message):
        parse_broker_url(url)


def test_broker_mode_from_the_environment():
    cfg = PlaneConfig.from_env(
        {"DYN_EVENT_PLANE": "zmq", "DYN_ZMQ_BROKER_URL": "xsub=tcp://a:1 , xpub=tcp://a:2"}
    )
    assert cfg.broker_mode
    assert PlaneConfig.from_env({"DYN_EVENT_PLANE": "zmq", "DYN_ZMQ_BROKER_ENABLED": "true"}).broker_mode
    assert not PlaneConfig.from_env({"DYN_EVENT_PLANE": "zmq", "DYN_ZMQ_BROKER_ENABLED": "false"}).broker_mode
    assert not PlaneConfig.from_env({"DYN_ZMQ_BROKER_ENABLED": "true"}).broker_mode  # nats is not zmq
    with pytest.raises(ConfigError, match="DYN_ZMQ_BROKER_ENABLED"):
        PlaneConfig.from_env({"DYN_ZMQ_BROKER_ENABLED": "maybe"})
    with pytest.raises(ConfigError, match="xpub= is missing"):
        PlaneConfig.from_env({"DYN_ZMQ_BROKER_URL": "xsub=tcp://a:1"})


BROKERS = [BrokerAddress(f"tcp://b{i}:5555", f"tcp://b{i}:5556") for i in range(5)]


def test_fanout_zero_or_all_selects_every_broker():
    assert select_brokers(1, BROKERS, 0) == sorted(BROKERS, key=lambda b: b.key)
    assert len(select_brokers(1, BROKERS, 9)) == 5


@given(st.integers(1, 2**53), st.integers(1, 4))
def test_rendezvous_choice_is_stable_and_moves_only_the_removed_brokers_publishers(publisher_id, k):
    chosen = select_brokers(publisher_id, BROKERS, k)
    assert len(chosen) == k
    assert select_brokers(publisher_id, list(reversed(BROKERS)), k) == chosen  # order-independent
    removed = BROKERS[0]
    after = select_brokers(publisher_id, [b for b in BROKERS if b != removed], k)
    if removed not in chosen:
        assert set(after) == set(chosen)
    else:
        assert set(chosen) - {removed} <= set(after)


def test_rendezvous_spreads_publishers_over_brokers():
    counts = {b: 0 for b in BROKERS}
    for publisher_id in range(1, 5001):
        for broker in select_brokers(publisher_id, BROKERS, 2):
            counts[broker] += 1
    assert all(1600 < c < 2400 for c in counts.values()), counts  # 10,000 choices, 2,000 each on average


def test_dedup_drops_copies_and_stays_bounded():
    cache = DedupCache(100)
    assert cache.first_time(1, 0)
    assert not cache.first_time(1, 0)
    assert cache.first_time(2, 0)
    for seq in range(1, 1000):
        assert cache.first_time(1, seq)
        assert not cache.first_time(1, seq)
    assert len(cache) == 100
    assert cache.duplicates == 1000
    assert cache.first_time(1, 5)  # long forgotten: the window is what bounds memory
    with pytest.raises(ConfigError):
        DedupCache(0)


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50)), max_size=300))
def test_dedup_with_a_large_enough_window_passes_each_pair_once(pairs):
    cache = DedupCache(1000)
    passed = [p for p in pairs if cache.first_time(*p)]
    assert sorted(passed) == sorted(set(pairs))


def test_broker_records():
    address = BrokerAddress("tcp://127.0.0.1:1", "tcp://127.0.0.1:2")
    assert parse_broker_record(broker_record(7, address)) == address
    for bad in (b"nope", b"{}", b'{"type":"ZmqBroker","xsub":"x","xpub":"tcp://a:1"}'):
        with pytest.raises(InvalidDiscoveryRecord):
            parse_broker_record(bad)


# --- a publisher's stable identity (HRW across restarts) -----------------------------------------------


@given(st.text(min_size=1, max_size=30), st.text(alphabet="abcxyz-_", min_size=1, max_size=10))
def test_a_publishers_identity_is_stable_below_2_53_and_picks_the_same_brokers(name: str, topic: str) -> None:
    from meshplane.core.names import Scope
    from meshplane.core.records import publisher_identity

    scope = Scope.endpoint("ns", "worker", "generate")
    identity = publisher_identity(name, scope, topic)
    assert 0 < identity < 2**53  # JSON keeps it exact, as Dynamo's ids
    assert publisher_identity(name, scope, topic) == identity  # every life, every process
    assert select_brokers(publisher_identity(name, scope, topic), BROKERS, 2) == select_brokers(
        identity, BROKERS, 2
    )


def test_identities_differ_by_name_scope_and_topic_and_spread_over_brokers() -> None:
    from meshplane.core.names import Scope
    from meshplane.core.records import publisher_identity

    a, b = Scope.endpoint("ns", "worker", "generate"), Scope.component("ns", "worker")
    ids = {
        publisher_identity("host-1", a, "kv"),
        publisher_identity("host-2", a, "kv"),
        publisher_identity("host-1", b, "kv"),
        publisher_identity("host-1", a, "kv-events"),
    }
    assert len(ids) == 4
    chosen = {select_brokers(publisher_identity(f"worker-{i}", a, "kv"), BROKERS, 1)[0] for i in range(50)}
    assert len(chosen) == len(BROKERS)  # named publishers still spread over every broker
