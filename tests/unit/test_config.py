from pathlib import Path

import pytest

from meshplane import Codec, ConfigError, PlaneConfig, WireFormat


def test_defaults_follow_the_seed():
    cfg = PlaneConfig.from_env({})
    assert cfg.event_plane == "nats"
    assert cfg.discovery_backend == "file"
    assert cfg.host == "127.0.0.1"
    assert cfg.wire_format is WireFormat.DYNAMO


def test_environment_is_read():
    cfg = PlaneConfig.from_env(
        {
            "DYN_EVENT_PLANE": "ZMQ",
            "NATS_SERVER": "nats://h:1",
            "DYN_DISCOVERY_BACKEND": "file",
            "DYN_FILE_KV": "/tmp/kv",
            "ETCD_ENDPOINTS": "http://a:1, b:2",
            "ETCD_LEASE_TTL": "7",
            "DYN_EVENT_PLANE_HOST": "10.0.0.1",
            "MESHPLANE_WIRE_FORMAT": "seed",
            "MESHPLANE_CODEC": "json",
            "MESHPLANE_SNDHWM": "5",
            "MESHPLANE_RCVHWM": "0",
            "MESHPLANE_BUSY_POLL": "0.0005",
        }
    )
    assert cfg.event_plane == "zmq"
    assert cfg.nats_server == "nats://h:1"
    assert cfg.discovery_backend == "file"
    assert cfg.file_kv == Path("/tmp/kv")
    assert cfg.etcd_endpoints == ("http://a:1", "b:2")
    assert cfg.etcd_lease_ttl == 7
    assert cfg.host == "10.0.0.1"
    assert (cfg.wire_format, cfg.codec) == (WireFormat.HEADER8, Codec.JSON)
    assert (cfg.send_hwm, cfg.receive_hwm) == (5, 0)
    assert cfg.busy_poll == 0.0005


def test_etcd_endpoints_alone_select_etcd():
    assert PlaneConfig.from_env({"ETCD_ENDPOINTS": "h:1"}).discovery_backend == "etcd"


def test_code_overrides_the_environment():
    assert PlaneConfig.from_env({"DYN_EVENT_PLANE": "zmq"}, event_plane="nats").event_plane == "nats"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DYN_EVENT_PLANE": "kafka"}, "DYN_EVENT_PLANE"),
        ({"DYN_DISCOVERY_BACKEND": "zookeeper"}, "DYN_DISCOVERY_BACKEND"),
        ({"ETCD_LEASE_TTL": "soon"}, "ETCD_LEASE_TTL"),
        ({"ETCD_LEASE_TTL": "0"}, "etcd_lease_ttl"),
        ({"MESHPLANE_WIRE_FORMAT": "v9"}, "MESHPLANE_WIRE_FORMAT"),
        ({"MESHPLANE_CODEC": "xml"}, "MESHPLANE_CODEC"),
        ({"MESHPLANE_RCVHWM": "-1"}, "receive_hwm"),
        ({"MESHPLANE_SEND_WHEN_FULL": "block"}, "MESHPLANE_SEND_WHEN_FULL"),
        ({"ETCD_ENDPOINTS": " , "}, "ETCD_ENDPOINTS"),
        ({"MESHPLANE_BUSY_POLL": "soon"}, "MESHPLANE_BUSY_POLL"),
        ({"MESHPLANE_BUSY_POLL": "-0.001"}, "busy_poll"),
        ({"MESHPLANE_BUSY_POLL": "2"}, "busy_poll"),
    ],
)
def test_bad_values_name_the_variable(env, message):
    with pytest.raises(ConfigError, match=message):
        PlaneConfig.from_env(env)


def test_send_when_full_is_read_in_any_case():
    assert PlaneConfig.from_env({}).send_when_full == "drop"
    assert PlaneConfig.from_env({"MESHPLANE_SEND_WHEN_FULL": "WAIT"}).send_when_full == "wait"


def test_publisher_id_and_metrics_are_read_and_checked():
    config = PlaneConfig.from_env(
        {
            "MESHPLANE_PUBLISHER_ID": "worker-7",
            "MESHPLANE_METRICS_PORT": "9464",
            "MESHPLANE_METRICS_PUBLISHERS": "5",
        }
    )
    assert (config.publisher_name, config.metrics_port, config.metrics_publishers) == ("worker-7", 9464, 5)
    assert PlaneConfig.from_env({}).metrics_port is None  # no endpoint unless asked for
    with pytest.raises(ConfigError, match="MESHPLANE_METRICS_PORT"):
        PlaneConfig.from_env({"MESHPLANE_METRICS_PORT": "70000"})
    with pytest.raises(ConfigError, match="MESHPLANE_PUBLISHER_ID"):
        PlaneConfig(publisher_name="  ")
