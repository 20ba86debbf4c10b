"""Take the dashboard's screenshots in docs/img from a server with demo traffic (about 40 s).

python docs/screenshots.py            # needs chromium (make test installs it) and playwright
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import aiohttp
from playwright.async_api import async_playwright

from meshplane import EventPublisher, PlaneConfig, Scope
from meshplane.launchers import StreamsServerProcess
from meshplane.plane import EventPlane

OUT = Path(__file__).parent / "img"
TRAFFIC_SECS = 30


async def traffic(http: aiohttp.ClientSession, url: str, stop: asyncio.Event) -> None:
    """Orders at a varying rate; a consumer group that commits most of them, then stops on one partition."""
    n = 0
    member = await (await http.post(f"{url}/consumer-groups/billing/join", json={})).json()
    while not stop.is_set():
        n += 1
        burst = 20 + (n % 10) * 8
        events = [
            {
                "event_type": "order.created",
                "key": f"customer-{i % 7}",
                "data": {"order": n * 100 + i, "eur": i * 3.5},
            }
            for i in range(burst)
        ]
        await http.post(f"{url}/topics/orders/publish", json={"events": events})
        await http.post(
            f"{url}/stream/chat/publish", json={"event": "message", "data": {"text": f"hello {n}"}}
        )
        stats = await (await http.get(f"{url}/topics/orders/stats")).json()
        for p in stats["partitions"][:3]:  # partition 3 is never committed: its lag grows
            commit = {"partition_id": p["partition_id"], "offset": max(0, p["next_offset"] - 5)}
            commit |= {"member_id": member["member_id"], "generation": member["generation"]}
            await http.post(f"{url}/consumer-groups/billing/offsets/commit", json=commit)
        await http.post(f"{url}/consumer-groups/billing/members/{member['member_id']}/heartbeat", json={})
        await asyncio.sleep(0.25)


async def main() -> None:
    if shutil.which("chromium") is None:
        raise SystemExit("chromium is missing: `make test` installs it")
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as kv:
        env = {"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": kv}
        config = PlaneConfig.from_env(env, event_plane="zmq")
        async with EventPlane(config) as plane:
            for scope, topic in [
                (Scope.endpoint("dynamo", "worker", "generate"), "kv-events"),
                (Scope.endpoint("dynamo", "worker", "generate"), "kv-events"),
                (Scope.endpoint("dynamo", "router", "route"), "decisions"),
                (Scope.component("dynamo", "planner"), "scale"),
            ]:
                await EventPublisher.create(scope, topic, plane=plane)
            with StreamsServerProcess(env=env) as server:
                url = server.start().url
                await shoot(url)


async def shoot(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        await http.post(f"{url}/topics/orders", json={"num_partitions": 4})
        await http.post(f"{url}/consumer-groups/billing", json={"topic": "orders"})
        stop = asyncio.Event()
        task = asyncio.create_task(traffic(http, url, stop))
        await asyncio.sleep(TRAFFIC_SECS)
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
            page = await browser.new_page(viewport={"width": 1280, "height": 860})
            for name, path in [
                ("overview", "/ui"),
                ("topics", "/ui/topics"),
                ("group", "/ui/groups/billing"),
                ("messages", "/ui/browse?target=topic%3Aorders%3A1"),
                ("plane", "/ui/plane"),
            ]:
                await page.goto(url + path)
                await page.wait_for_selector("#status.live")
                await page.wait_for_timeout(2500)  # a few ticks, so the charts have their newest points
                await page.screenshot(path=str(OUT / f"dashboard-{name}.png"))
                print(f"docs/img/dashboard-{name}.png")
            await browser.close()
        stop.set()
        await task


if __name__ == "__main__":
    asyncio.run(main())
