"""Foreign NATS clients, unchanged, through the NATS door (issue 59): the JavaScript client from npm
(``nats`` 2.29.3 under Node 20: ``make .node-nats``) and the Dynamo runtime's NATS event plane
(ai-dynamo-runtime 1.6.1: ``make .venv-dynamo``). Without them these tests fail, they never skip."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import msgpack
import nats
import pytest
from nats.aio.msg import Msg

from meshplane.core.envelope import decode_envelope
from meshplane.core.names import EVENT_CHANNELS_BUCKET
from meshplane.mesh.client import MeshClient
from tests.dynamo_runtime import dynamo, snapshot_metrics, snapshot_values
from tests.helpers import eventually
from tests.integration.test_nats_door import NatsMesh, Received
from tests.support.mesh import Inbox, interest_reached

ROOT = Path(__file__).resolve().parents[2]
NODE_MODULES = ROOT / ".node-nats" / "node_modules"

JS_PEER = """
const { connect, headers, StringCodec } = require("nats");
(async () => {
  const [url, count] = [process.argv[2], Number(process.argv[3])];
  const nc = await connect({ servers: url });
  const out = (o) => process.stdout.write(JSON.stringify(o) + "\\n");
  const sub = nc.subscribe("to.js.>");
  (async () => {
    for await (const m of sub) out({ got: m.subject, data: Buffer.from(m.data).toString("hex") });
  })();
  await nc.flush();
  out({ ready: true });
  for await (const line of require("readline").createInterface({ input: process.stdin })) {
    if (line === "publish") {
      for (let i = 0; i < count; i++) {
        const h = headers(); h.set("Seq", String(i));
        nc.publish("from.js.items", Uint8Array.from([i, 0, 255, 10, 13]), { headers: h });
      }
      await nc.flush();
      out({ published: count });
    } else if (line === "request") {
      const reply = await nc.request("svc.py", StringCodec().encode("from js"), { timeout: 10000 });
      out({ reply: StringCodec().decode(reply.data) });
    } else if (line === "quit") { break; }
  }
  await nc.drain();
  out({ drained: true });
  process.exit(0);
})().catch((e) => { process.stdout.write(JSON.stringify({ error: String(e) }) + "\\n"); process.exit(1); });
"""


EVENTS = 20


def snapshots(events: list[tuple[str, bytes]]) -> list[dict[str, object]]:
    """The metrics of the snapshots the runtime published (not its zeroed idle heartbeats)."""
    found = []
    for _, body in events:
        payload = decode_envelope(body).payload
        if msgpack.unpackb(payload)["wall_time"]:
            found.append(snapshot_metrics(payload))
    return found


@pytest.fixture(scope="module")
def mesh() -> Iterator[NatsMesh]:
    with NatsMesh(3) as doors:
        yield doors


class JsPeer:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def read(self, timeout: float = 30) -> dict[str, object]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        assert line, f"the JS client exited ({await self.proc.wait()})"
        message: dict[str, object] = json.loads(line)
        assert "error" not in message, message
        return message

    async def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()


async def test_the_javascript_client_publishes_subscribes_and_requests_across_nodes(
    mesh: NatsMesh, tmp_path: Path
) -> None:
    node = shutil.which("node")
    assert node is not None, "no node: `make .node-nats` installs Node and the nats package"
    assert (NODE_MODULES / "nats").is_dir(), f"no {NODE_MODULES}/nats: `make .node-nats` installs it"
    script = tmp_path / "peer.js"
    script.write_text(JS_PEER)
    count = 50
    proc = await asyncio.create_subprocess_exec(
        node,
        str(script),
        mesh.url("a"),
        str(count),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={"NODE_PATH": str(NODE_MODULES), "PATH": "/usr/bin:/bin"},
    )
    js = JsPeer(proc)
    on_b = Received()
    nc_b = await nats.connect(mesh.url("b"))
    client_c = await MeshClient(mesh["c"].route_url).connect()
    inbox = Inbox()
    try:
        assert (await js.read())["ready"]
        await nc_b.subscribe("from.js.*", cb=on_b.cb)
        await nc_b.flush()
        client_c.subscribe("from.js.>", inbox)
        await client_c.flush()
        for peer in ("b", "c"):
            await interest_reached(mesh["a"], peer, "from.js.>" if peer == "c" else "from.js.*")
        await js.send("publish")
        assert (await js.read())["published"] == count
        await eventually(lambda: len(on_b.msgs) == count and len(inbox.events) == count, what="JS's events")
        expected = [bytes([i, 0, 255, 10, 13]) for i in range(count)]
        assert [m.data for m in on_b.msgs] == expected  # in order, byte for byte
        assert [m.headers for m in on_b.msgs] == [{"Seq": str(i)} for i in range(count)]
        # headers travel inside the event (a NATS envelope) to mesh clients: the payload is at its end
        assert all(body.endswith(want) for (_, body), want in zip(inbox.events, expected, strict=True))
        await interest_reached(mesh["c"], "a", "to.js.>")
        await client_c.publish("to.js.x", b"\x00from mesh")
        await client_c.flush()
        got = await js.read()
        assert got == {"got": "to.js.x", "data": b"\x00from mesh".hex()}

        async def answer(msg: Msg) -> None:
            await msg.respond(b"py says: " + msg.data)

        await nc_b.subscribe("svc.py", cb=answer)
        await nc_b.flush()
        await interest_reached(mesh["a"], "b", "svc.py")
        await js.send("request")
        assert (await js.read())["reply"] == "py says: from js"
        await js.send("quit")
        assert (await js.read())["drained"]  # its drain: the door answered its UNSUBs and flush
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await nc_b.close()
        await client_c.close()


async def test_the_dynamo_runtimes_nats_plane_through_node_a_reaches_a_subscriber_on_node_c(
    mesh: NatsMesh, tmp_path: Path
) -> None:
    """ai-dynamo-runtime 1.6.1 publishing with NATS_SERVER pointed at node a's door; a MeshClient on c
    gets what the runtime sent, byte for byte (as a nats-py subscriber on b sees it)."""
    file_kv = tmp_path / "kv"
    (file_kv / EVENT_CHANNELS_BUCKET).mkdir(parents=True)
    as_nats, on_c = Received(), Inbox()
    nc_b = await nats.connect(mesh.url("b"))
    client_c = await MeshClient(mesh["c"].route_url).connect()
    try:
        await nc_b.subscribe(">", cb=as_nats.cb)
        await nc_b.flush()
        client_c.subscribe(">", on_c)
        await client_c.flush()
        for peer in ("b", "c"):
            await interest_reached(mesh["a"], peer, ">")
        env = {"DYN_FILE_KV": str(file_kv), "NATS_SERVER": mesh.url("a")}
        async with dynamo("pub", "file", "nats", tmp_path, **env) as runtime:
            await runtime.send(f"publish {EVENTS}")
            assert (await runtime.read())["published"] == EVENTS
            await eventually(lambda: len(snapshots(on_c.events)) >= EVENTS, timeout=30, what="20 on c")
        mesh_side = list(on_c.events)
        await eventually(lambda: len(as_nats.msgs) >= len(mesh_side), what="the same at b's nats-py")
        nats_side = [(m.subject, m.data) for m in as_nats.msgs][: len(mesh_side)]
        assert mesh_side == nats_side  # byte-identical, on the same subjects
        assert snapshots(mesh_side)[:EVENTS] == [snapshot_values(i) for i in range(EVENTS)]
    finally:
        await nc_b.close()
        await client_c.close()
