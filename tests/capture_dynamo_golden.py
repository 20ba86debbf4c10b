"""Capture the Dynamo runtime's own discovery records and wire messages into tests/golden/dynamo-1.6.1/.

    make .venv-dynamo && .venv/bin/python -m tests.capture_dynamo_golden

runs the runtime's forward-pass-metrics publisher (``tests/dynamo_peer.py``) four times, each on real
servers on free loopback ports, and writes what it produced, byte for byte:

- ``file-kv/zmq/`` and ``file-kv/nats/``: the files its file backend wrote under ``DYN_FILE_KV``
  (relative path = the key, escaped; content = the record), with a ZeroMQ and a NATS event plane;
- ``etcd-zmq.json``: every key it put in etcd (key, value, the TTL of the lease it is attached to);
- ``zmq-event.json``: the 4 frames of one published snapshot, as a plain pyzmq SUB received them;
  ``nats-event.json``: the subject and data of one, as plain nats-py received it;
- ``broker/``: a broker record in the layout the runtime reads (1.6.1 ships no broker, so nothing of
  its own registers one: this record is ours, and the capture checks that the runtime accepts it:
  its publisher, with ``DYN_ZMQ_BROKER_ENABLED=true``, connects to the XSUB it names) and
  ``broker-event.json``: the frames the runtime's publisher then sent into that XSUB;
- ``scopes.json``: a component and a namespace scope in the form the runtime reads (each checked the
  same way, in a broker record: the runtime logs and skips a record whose scope it cannot read).

Ids and ports differ at each run; the tests compare everything else.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgpack
import nats
import zmq
import zmq.asyncio

from meshplane.core.records import key_to_file_name
from meshplane.discovery.etcd import connect_etcd, parse_endpoint
from meshplane.launchers import EtcdServer, NatsServer
from tests.dynamo_runtime import ENDPOINT, TOPIC, VERSION, dynamo

GOLDEN = Path(__file__).resolve().parent / "golden" / f"dynamo-{VERSION}"
SUBJECT = "namespace.{}.component.{}.endpoint.{}.{}".format(*ENDPOINT, TOPIC)
BROKER_KEY = f"v1/event_channels/namespace/{ENDPOINT[0]}/component/zmq_broker/topic/broker/1f"


def write_json(name: str, value: Any) -> None:
    (GOLDEN / name).write_text(json.dumps(value, indent=2) + "\n")


def published(payload: bytes) -> bool:
    """A published snapshot, not one of the runtime's zeroed idle heartbeats."""
    return bool(msgpack.unpackb(payload)["wall_time"])


def files_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


async def until_files(folder: Path, timeout: float = 30.0) -> list[Path]:
    deadline = asyncio.get_running_loop().time() + timeout
    while not (files := files_in(folder)):
        assert asyncio.get_running_loop().time() < deadline, f"the runtime wrote nothing into {folder}"
        await asyncio.sleep(0.05)
    return files


def keep_files(kv: Path, files: list[Path], into: str) -> list[Path]:
    target = GOLDEN / into
    shutil.rmtree(target, ignore_errors=True)
    kept = []
    for f in files:
        (target / f.relative_to(kv)).parent.mkdir(parents=True, exist_ok=True)
        kept.append(Path(shutil.copyfile(f, target / f.relative_to(kv))))
    return kept


async def zmq_message(sock: zmq.asyncio.Socket, payload_of: int) -> list[bytes]:
    """The first multipart message whose envelope carries a published snapshot (``payload_of``: the
    frame holding the envelope, after a 5-byte header)."""

    async def first() -> list[bytes]:
        while not published(
            msgpack.unpackb((frames := await sock.recv_multipart())[payload_of][5:])["payload"]
        ):
            pass
        return frames

    return await asyncio.wait_for(first(), 30)


async def capture_file_zmq(work: Path) -> None:
    kv = work / "kv-zmq"
    async with dynamo("pub", "file", "zmq", work, DYN_FILE_KV=str(kv)) as pub:
        [record] = keep_files(kv, await until_files(kv), "file-kv/zmq")
        endpoint = json.loads(record.read_bytes())["transport"]["config"]["endpoint"]
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
        sock.connect(endpoint)
        await asyncio.wait_for(sock.recv_multipart(), 30)  # an idle heartbeat: connected
        await pub.send("publish 1")
        frames = await zmq_message(sock, 3)
        sock.close(0)
        ctx.term()
    write_json("zmq-event.json", {"frames": [f.hex() for f in frames]})


async def capture_file_nats(work: Path, server: NatsServer) -> None:
    kv = work / "kv-nats"
    client = await nats.connect(server.url)
    sub = await client.subscribe(SUBJECT)
    await client.flush()
    async with dynamo("pub", "file", "nats", work, DYN_FILE_KV=str(kv), NATS_SERVER=server.url) as pub:
        keep_files(kv, await until_files(kv), "file-kv/nats")
        await pub.send("publish 1")
        while not published(msgpack.unpackb((msg := await sub.next_msg(30)).data)["payload"]):
            pass  # the runtime's idle heartbeats (each within 30 s: one a second)
    await client.close()
    write_json("nats-event.json", {"subject": msg.subject, "headers": msg.headers, "data": msg.data.hex()})


async def capture_etcd(work: Path, server: EtcdServer) -> None:
    client = await connect_etcd([parse_endpoint(server.endpoint)], None, 10)
    try:
        async with dynamo("pub", "etcd", "zmq", work, ETCD_ENDPOINTS=server.endpoint):
            deadline = asyncio.get_running_loop().time() + 30
            while not any(kv.key.startswith(b"v1/event_channels/") for kv in await client.get_all()):
                assert asyncio.get_running_loop().time() < deadline, "the runtime registered nothing in etcd"
                await asyncio.sleep(0.05)
            records = []
            for kv in await client.get_all():
                lease = await client.get_lease_info(kv.lease) if kv.lease else None
                records.append(
                    {
                        "key": kv.key.decode(),
                        "value": kv.value.decode(),
                        "lease_ttl": lease and lease.grantedTTL,
                    }
                )
    finally:
        await client.close()
    write_json("etcd-zmq.json", records)


def broker_record(xsub: str, scope: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "EventChannel",
        "scope": scope,
        "topic": "broker",
        "instance_id": 0x1F,
        "transport": {
            "kind": "ZmqBroker",
            # the publisher uses only the XSUB side
            "config": {"xsub_endpoints": [xsub], "xpub_endpoints": ["tcp://127.0.0.1:1"]},
        },
    }


async def runtime_takes_broker(
    work: Path, record: dict[str, Any], xsub: zmq.asyncio.Socket, keep: str
) -> list[bytes]:
    """Run the runtime's publisher in broker mode with only ``record`` in discovery; return the first
    frames it sent into ``xsub`` (the broker that record names), which proves it accepted the record."""
    kv = work / f"kv-{keep}"
    bucket, name = key_to_file_name(BROKER_KEY)
    (kv / bucket).mkdir(parents=True)
    (kv / bucket / name).write_text(json.dumps(record, separators=(",", ":")))
    if keep:
        keep_files(kv, files_in(kv), keep)
    async with dynamo("pub", "file", "zmq", work, DYN_FILE_KV=str(kv), DYN_ZMQ_BROKER_ENABLED="true") as pub:
        await asyncio.wait_for(xsub.recv_multipart(), 30)  # an idle heartbeat: connected
        await pub.send("publish 1")
        return await zmq_message(xsub, 3)


async def capture_broker(work: Path) -> None:
    ctx = zmq.asyncio.Context()
    xsub = ctx.socket(zmq.XSUB)
    xsub.bind("tcp://127.0.0.1:*")
    await xsub.send(b"\x01")  # subscribe to everything, upstream to each publisher that connects
    endpoint = xsub.getsockopt_string(zmq.LAST_ENDPOINT)
    scopes = {
        "component": {"kind": "component", "namespace": ENDPOINT[0], "component": "zmq_broker"},
        # the runtime files it by its key and does not compare: this shows how a namespace scope is read
        "namespace": {"kind": "namespace", "name": ENDPOINT[0]},
    }
    frames = await runtime_takes_broker(work, broker_record(endpoint, scopes["component"]), xsub, "broker")
    write_json("broker-event.json", {"frames": [f.hex() for f in frames]})
    await runtime_takes_broker(work, broker_record(endpoint, scopes["namespace"]), xsub, "")
    write_json("scopes.json", scopes)
    xsub.close(0)
    ctx.term()


async def main() -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, NatsServer() as nats_server, EtcdServer() as etcd_server:
        work = Path(tmp)
        nats_server.start()
        etcd_server.start()
        await capture_file_zmq(work)
        await capture_file_nats(work, nats_server)
        await capture_etcd(work, etcd_server)
        await capture_broker(work)
    print(f"captured into {GOLDEN}")


if __name__ == "__main__":
    asyncio.run(main())
