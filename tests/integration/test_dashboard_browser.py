"""The dashboard in a real headless chromium (Debian's, driven by Playwright) against a real server."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from playwright.sync_api import Browser, ConsoleMessage, Page, Playwright, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from meshplane.launchers import MeshCluster, StreamsServerProcess, free_port
from tests.helpers import wait_until
from tests.support.servers import start_together

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TOKEN = "dashboard-browser-token-42"
WAIT_MS = 15_000


def post(url: str, path: str, body: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answer = requests.post(url + path, json=body, headers=headers, timeout=5)
    answer.raise_for_status()
    result: dict[str, Any] = answer.json()
    return result


def publish(url: str, topic: str, n: int, partition: int = 0, data: object = None) -> None:
    events = [{"event_type": "e", "data": data if data is not None else {"i": i}} for i in range(n)]
    post(url, f"/topics/{topic}/publish", {"events": events, "partition": partition})


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    assert CHROMIUM, "chromium is missing: `make test` installs it (apt-get install chromium)"
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    yield launched
    launched.close()


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with StreamsServerProcess() as proc:
        base = proc.start().url
        post(base, "/topics/orders", {"num_partitions": 2})
        publish(base, "orders", 5, partition=1)
        post(base, "/consumer-groups/billing", {"topic": "orders"})
        post(base, "/stream/chat/publish", {"event": "message", "data": {"text": "hello"}})
        yield base


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh page; the test fails if the page logged an error or a warning, or threw."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    opened = context.new_page()
    problems: list[str] = []

    def console(message: ConsoleMessage) -> None:
        if message.type in ("error", "warning"):
            problems.append(f"{message.type}: {message.text} at {message.location}")

    opened.on("console", console)
    opened.on("pageerror", lambda error: problems.append(f"uncaught: {error}"))
    yield opened
    context.close()
    assert problems == []


def lag_is(page: Page, lag: str) -> None:
    page.wait_for_function(
        "lag => document.querySelector('[data-test=lag]')?.innerText === lag", arg=lag, timeout=WAIT_MS
    )


@pytest.mark.parametrize(
    ("path", "heading"),
    [
        ("/ui", "Overview"),
        ("/ui/topics", "Topics and rooms"),
        ("/ui/topics/orders", "Topic orders"),
        ("/ui/groups", "Consumer groups"),
        ("/ui/groups/billing", "Consumer group billing"),
        ("/ui/browse?target=topic%3Aorders%3A1", "Messages"),
        ("/ui/plane", "Event plane"),
    ],
)
def test_every_page_loads_live_with_no_console_errors(url: str, page: Page, path: str, heading: str) -> None:
    page.goto(url + path)
    assert page.inner_text("h1") == heading
    page.wait_for_selector("#status.live", timeout=WAIT_MS)
    page.wait_for_function("() => document.querySelector('main').innerText.length > 40", timeout=WAIT_MS)
    assert "No such" not in page.inner_text("main")


def test_navigation_keeps_one_page_and_deep_links_back(url: str, page: Page) -> None:
    page.goto(url + "/ui")
    page.evaluate("window.stayed = true")
    page.click("text=Topics & rooms")
    page.click("a[href='/ui/topics/orders']")
    assert page.url == url + "/ui/topics/orders"
    page.wait_for_selector("[data-test=next-1]", timeout=WAIT_MS)
    page.go_back()
    assert page.inner_text("h1") == "Topics and rooms"
    assert page.evaluate("window.stayed") is True  # no reload on the way


def test_publishing_moves_the_rate_chart_and_the_offsets_without_a_reload(url: str, page: Page) -> None:
    page.goto(url + "/ui/topics/orders")
    page.wait_for_selector("[data-test=next-0]", timeout=WAIT_MS)
    before = int(page.inner_text("[data-test=next-0]").replace(",", ""))
    page.evaluate("window.stayed = true")
    publish(url, "orders", 7, partition=0)
    page.wait_for_function(
        "n => document.querySelector('[data-test=next-0]').innerText.replace(',', '') == String(n)",
        arg=before + 7,
        timeout=WAIT_MS,
    )
    page.goto(url + "/ui")
    page.evaluate("window.stayed = true")
    page.wait_for_selector("#rate-chart[data-points]", timeout=WAIT_MS)
    for _ in range(100):  # a rate shows up in the tick after a publish; keep publishing until it does
        publish(url, "orders", 50, partition=1)
        try:
            page.wait_for_function(
                "() => Number(document.querySelector('#rate-chart').dataset.last) > 0", timeout=300
            )
            break
        except PlaywrightTimeout:  # not yet
            continue
    # the card and the chart's last point, read in one go: the same tick's rate, above zero
    card, last = page.evaluate(
        "() => [document.querySelector('[data-test=in-rate]').innerText,"
        " document.querySelector('#rate-chart').dataset.last]"
    )
    assert float(last) > 0
    assert float(card.replace(",", "")) == pytest.approx(float(last), abs=0.051)  # shown to one decimal
    assert page.evaluate("window.stayed") is True


def test_a_group_that_stops_committing_shows_growing_lag(url: str, page: Page) -> None:
    post(url, "/topics/payments", {"num_partitions": 1})
    publish(url, "payments", 4, partition=0)
    joined = post(url, "/consumer-groups/ledger", {"topic": "payments"})
    member = post(url, "/consumer-groups/ledger/join", {})
    assert joined["success"]
    commit = {
        "partition_id": 0,
        "offset": 4,
        "member_id": member["member_id"],
        "generation": member["generation"],
    }
    post(url, "/consumer-groups/ledger/offsets/commit", commit)
    page.goto(url + "/ui/groups/ledger")
    lag_is(page, "0")
    publish(url, "payments", 3, partition=0)  # the consumer stops committing
    lag_is(page, "3")
    publish(url, "payments", 6, partition=0)
    lag_is(page, "9")
    first_age = page.inner_text("[data-test=lag-time]")
    page.wait_for_function(
        "age => document.querySelector('[data-test=lag-time]').innerText !== age",
        arg=first_age,
        timeout=WAIT_MS,
    )  # the oldest unconsumed event keeps waiting: its age grows
    assert page.inner_text("[data-test=lag-0]") == "9"
    page.wait_for_function(
        "() => Number(document.querySelector('#lag-chart').dataset.last) === 9", timeout=WAIT_MS
    )


def test_a_spark_querys_lag_shows_beside_the_groups(url: str, page: Page) -> None:
    post(url, "/topics/clicks", {"num_partitions": 1})
    publish(url, "clicks", 5)
    noted = requests.put(
        url + "/topics/clicks/readers/spark-daily",
        json={"offsets": {"0": 2}, "identity": "queryName"},
        timeout=5,
    )
    noted.raise_for_status()  # what a Spark source says after each batch
    page.goto(url + "/ui/groups")
    row = "[data-reader=spark-daily]"
    page.wait_for_selector(f"{row} [data-test=reader-lag]:text-is('3')", timeout=WAIT_MS)
    publish(url, "clicks", 4)  # the query reads no further
    page.wait_for_selector(f"{row} [data-test=reader-lag]:text-is('7')", timeout=WAIT_MS)
    assert page.inner_text(f"{row} td:nth-child(3)") == "clicks"
    assert page.inner_text(f"{row} [data-test=reader-identity]") == "queryName"  # how it was named
    first_age = page.inner_text(f"{row} [data-test=reader-lag-time]")
    page.wait_for_function(  # the oldest event it has not read keeps waiting: its age grows
        "age => document.querySelector('[data-reader=spark-daily] [data-test=reader-lag-time]')"
        ".innerText !== age",
        arg=first_age,
        timeout=WAIT_MS,
    )


def test_the_browser_shows_an_event_published_a_moment_ago(url: str, page: Page) -> None:
    page.goto(url + "/ui/browse?target=topic%3Aorders%3A1")
    page.wait_for_selector("#events tbody tr[data-offset]", timeout=WAIT_MS)
    page.check("#tail")
    marker = f"fresh-{uuid.uuid4().hex[:8]}"
    page.wait_for_selector("#status.live", timeout=WAIT_MS)
    publish(url, "orders", 1, partition=1, data={"marker": marker, "blob": [1, 2, 3]})
    row = f"#events tbody tr:has-text('{marker}')"
    page.wait_for_selector(row, timeout=WAIT_MS)
    assert '"marker"' in page.inner_text(row)


def test_the_event_plane_page_shows_the_mesh_placeholder(url: str, page: Page) -> None:
    page.goto(url + "/ui/plane")
    page.wait_for_selector("text=not a mesh node", timeout=WAIT_MS)


def test_the_event_plane_page_shows_a_mesh_node_and_its_links(page: Page) -> None:
    with MeshCluster(2, cluster="dash") as mesh:
        mesh.start().wait_linked()
        page.goto(mesh["a"].url + "/ui/plane")
        page.wait_for_selector("#mesh >> text=of cluster dash", timeout=WAIT_MS)
        assert "Node a of cluster dash" in page.inner_text("#mesh")
        page.wait_for_selector("#mesh td:text-is('b')", timeout=WAIT_MS)  # its link to b
        assert "up" in page.inner_text("#mesh table")
        page.goto("about:blank")  # leave before the nodes stop: a live stream cut is not the page's error


@pytest.fixture(scope="module")
def guarded() -> Iterator[str]:
    with StreamsServerProcess(env={"MESHPLANE_STREAMS_TOKEN": TOKEN}) as proc:
        base = proc.start().url
        post(base, "/topics/secret-orders", {"num_partitions": 1}, token=TOKEN)
        yield base


def test_with_a_token_the_page_asks_for_it_and_never_puts_it_in_a_url(guarded: str, browser: Browser) -> None:
    context = browser.new_context()
    page = context.new_page()
    urls: list[str] = []
    statuses: dict[str, int] = {}
    page.on("request", lambda request: urls.append(request.url))
    page.on("response", lambda response: statuses.__setitem__(response.url.split("?")[0], response.status))
    page.goto(guarded + "/ui/topics")
    page.wait_for_selector("#login[open]", timeout=WAIT_MS)
    assert statuses[guarded + "/ui/api/live"] == 401
    assert "secret-orders" not in page.content()
    page.fill("#token", "wrong-token-wrong-token")
    page.click("#login button[type=submit]")
    page.wait_for_selector("text=That token is not accepted", timeout=WAIT_MS)
    page.fill("#token", TOKEN)
    page.click("#login button[type=submit]")
    page.wait_for_selector("tr[data-topic=secret-orders]", timeout=WAIT_MS)
    page.wait_for_selector("#status.live", timeout=WAIT_MS)
    assert not any(TOKEN in u for u in urls)
    page.click("#logout")
    page.wait_for_selector("#login[open]", timeout=WAIT_MS)
    context.close()


# --- actions: create and delete topics, produce a message (issue 57) --------------------------------


def topics(url: str, token: str | None = None) -> list[str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return list(requests.get(f"{url}/topics", headers=headers, timeout=5).json()["topics"])


def confirm(page: Page, typed: str | None = None) -> None:
    page.wait_for_selector("#confirm[open]", timeout=WAIT_MS)
    if typed is not None:
        assert page.is_disabled("#confirm [data-confirm-ok]")  # not before the name is typed
        page.fill("#confirm [data-confirm-typed]", typed)
    page.click("#confirm [data-confirm-ok]")


def test_a_topic_is_created_from_the_topics_page_after_a_confirmation(url: str, page: Page) -> None:
    name = f"made-{uuid.uuid4().hex[:6]}"
    page.goto(url + "/ui/topics")
    page.fill("[data-action=create-topic] [name=name]", name)
    page.fill("[data-action=create-topic] [name=partitions]", "3")
    page.select_option("[data-action=create-topic] [name=retention]", "86400")
    page.click("[data-action=create-topic] button[type=submit]")
    page.wait_for_selector("#confirm[open]", timeout=WAIT_MS)
    assert f"Create topic {name} with 3 partition(s)?" in page.inner_text("#confirm")
    page.click("#confirm button[value=cancel]")  # cancelled: nothing happens
    assert name not in topics(url)
    page.click("[data-action=create-topic] button[type=submit]")
    confirm(page)
    page.wait_for_selector(f"text=Topic {name} created.", timeout=WAIT_MS)
    page.wait_for_selector(f"tr[data-topic='{name}']", timeout=WAIT_MS)  # the live table has it
    assert "24.0 h" in page.inner_text(f"tr[data-topic='{name}']")  # its retention
    stats = requests.get(f"{url}/topics/{name}/stats", timeout=5).json()
    assert len(stats["partitions"]) == 3


def test_a_message_is_produced_from_a_topics_page(url: str, page: Page) -> None:
    marker = f"produced-{uuid.uuid4().hex[:6]}"
    page.goto(url + "/ui/topics/orders")
    page.wait_for_selector("[data-test=next-1]", timeout=WAIT_MS)
    before = int(page.inner_text("[data-test=next-1]").replace(",", ""))
    page.fill("[data-action=produce] [name=partition]", "1")
    page.fill("[data-action=produce] [name=key]", "customer-7")
    page.fill("[data-action=produce] [name=value]", f'{{"marker": "{marker}"}}')
    page.click("[data-action=produce] button[type=submit]")
    confirm(page)
    page.wait_for_selector(f"text=Produced at partition 1, offset {before}.", timeout=WAIT_MS)
    page.wait_for_function(
        "n => document.querySelector('[data-test=next-1]').innerText.replace(',', '') == String(n)",
        arg=before + 1,
        timeout=WAIT_MS,
    )
    read = post(url, "/topics/orders/partitions/1/consume", {"from_offset": before, "limit": 1})
    (event,) = read["events"]
    assert (event["data"], event["key"]) == ({"marker": marker}, "customer-7")


def test_a_topic_is_deleted_only_once_its_name_is_typed(url: str, page: Page) -> None:
    name = f"doomed-{uuid.uuid4().hex[:6]}"
    post(url, f"/topics/{name}", {"num_partitions": 1})
    page.goto(url + f"/ui/topics/{name}")
    page.click("[data-action=delete-topic]")
    page.wait_for_selector("#confirm[open]", timeout=WAIT_MS)
    page.fill("#confirm [data-confirm-typed]", name[:-1])  # almost: still refused
    assert page.is_disabled("#confirm [data-confirm-ok]")
    page.click("#confirm button[value=cancel]")
    assert name in topics(url)
    page.click("[data-action=delete-topic]")
    confirm(page, typed=name)
    page.wait_for_url(url + "/ui/topics", timeout=WAIT_MS)
    assert name not in topics(url)


@pytest.fixture(scope="module")
def scoped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tokens = tmp_path_factory.mktemp("tokens") / "tokens"
    tokens.write_text(f"{TOKEN} admin\n{READ_TOKEN} read\n")
    with StreamsServerProcess(extra_args=("--token-file", str(tokens))) as proc:
        base = proc.start().url
        post(base, "/topics/kept", {"num_partitions": 1}, token=TOKEN)
        yield base


READ_TOKEN = "dashboard-read-only-token-7"


def test_a_read_only_token_is_refused_each_action_and_told_why(scoped: str, browser: Browser) -> None:
    context = browser.new_context()
    page = context.new_page()
    page.goto(scoped + "/ui/topics/kept")
    page.wait_for_selector("#login[open]", timeout=WAIT_MS)
    page.fill("#token", READ_TOKEN)
    page.click("#login button[type=submit]")
    page.wait_for_selector("[data-test=next-0]", timeout=WAIT_MS)
    page.fill("[data-action=produce] [name=value]", "text, not JSON")
    page.click("[data-action=produce] button[type=submit]")
    confirm(page)
    page.wait_for_selector("text=Not produced: 403", timeout=WAIT_MS)
    page.click("[data-action=delete-topic]")
    confirm(page, typed="kept")
    page.wait_for_selector("text=Not deleted: 403", timeout=WAIT_MS)
    assert "kept" in topics(scoped, TOKEN)
    page.fill("[data-action=retention] [name=limit]", "10")
    page.select_option("[data-action=retention] [name=type]", "Messages")
    page.click("[data-action=retention] button[type=submit]")
    confirm(page)
    page.wait_for_selector("text=Not changed: 403", timeout=WAIT_MS)
    stats = requests.get(
        f"{scoped}/topics/kept/stats", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5
    )
    assert stats.json()["retention_policy"] == {"type": "Infinite"}
    page.goto(scoped + "/ui/topics")
    page.wait_for_selector("tr[data-topic=kept]", timeout=WAIT_MS)
    page.fill("[data-action=create-topic] [name=name]", "not-made")
    page.click("[data-action=create-topic] button[type=submit]")
    confirm(page)
    page.wait_for_selector("text=Not created: 403", timeout=WAIT_MS)
    assert "not-made" not in topics(scoped, TOKEN)
    context.close()


def committed_is(page: Page, partition: int, offset: int) -> None:
    page.wait_for_function(
        "([p, n]) => document.querySelector(`[data-test=committed-${p}]`)?.innerText.replace(',', '') == "
        "String(n)",
        arg=[partition, offset],
        timeout=WAIT_MS,
    )


def test_a_groups_offsets_are_reset_only_while_it_has_no_live_member(url: str, browser: Browser) -> None:
    group, topic = f"resets-{uuid.uuid4().hex[:6]}", f"reset-{uuid.uuid4().hex[:6]}"
    post(url, f"/topics/{topic}", {"num_partitions": 2})
    publish(url, topic, 6, partition=0)
    publish(url, topic, 4, partition=1)
    post(url, f"/consumer-groups/{group}", {"topic": topic})
    member = post(url, f"/consumer-groups/{group}/join", {})["member_id"]
    context = browser.new_context()
    page = context.new_page()
    problems: list[str] = []  # the browser logs the refused request itself: only that one is expected
    page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda error: problems.append(f"uncaught: {error}"))
    page.goto(url + f"/ui/groups/{group}")
    page.wait_for_selector(
        "[data-action=reset-offsets] select[name=partition] option[value='1']",
        state="attached",
        timeout=WAIT_MS,
    )

    def reset(to: str, partition: str = "", **fields: str) -> None:
        form = "[data-action=reset-offsets]"
        page.select_option(f"{form} [name=partition]", partition)
        page.select_option(f"{form} [name=to]", to)
        for field, value in fields.items():
            page.fill(f"{form} [name={field}]", value)
        page.click(f"{form} button[type=submit]")
        confirm(page)

    reset("latest")  # a live member: refused, as Kafka refuses
    page.wait_for_selector("text=Not reset: 409", timeout=WAIT_MS)
    assert "live members" in page.inner_text("[data-action=reset-offsets] [data-action-result]")
    requests.delete(f"{url}/consumer-groups/{group}/members/{member}/leave", timeout=5).raise_for_status()
    reset("latest")
    page.wait_for_selector("text=Reset: partition 0 at 6, partition 1 at 4.", timeout=WAIT_MS)
    committed_is(page, 0, 6)
    committed_is(page, 1, 4)
    reset("earliest")
    committed_is(page, 0, 0)
    committed_is(page, 1, 0)
    reset("offset", partition="1", offset="3")
    committed_is(page, 1, 3)
    committed_is(page, 0, 0)  # the other partition untouched
    reset("time", time="2999-01-01T00:00:00")  # after every event: the end
    committed_is(page, 0, 6)
    committed_is(page, 1, 4)
    context.close()
    assert [p for p in problems if "status of 409 (Conflict)" not in p] == []
    assert len(problems) == 1


# --- actions: retention, queues and nodes (issue 57) ---------------------------------------------------


def test_a_topics_retention_is_changed_from_its_page_and_a_bad_one_refused(url: str, page: Page) -> None:
    name = f"kept-{uuid.uuid4().hex[:6]}"
    post(url, f"/topics/{name}", {"num_partitions": 1})
    page.goto(url + f"/ui/topics/{name}")
    page.wait_for_selector("#topic >> text=retention infinite", timeout=WAIT_MS)
    form = "[data-action=retention]"
    page.select_option(f"{form} [name=type]", "Time")
    page.click(f"{form} button[type=submit]")  # no limit given: not sent
    page.wait_for_selector("text=Not changed: give a limit.", timeout=WAIT_MS)
    page.fill(f"{form} [name=limit]", "3600")
    page.click(f"{form} button[type=submit]")
    page.wait_for_selector("#confirm[open]", timeout=WAIT_MS)
    assert f"Change the retention of {name} to time 3600?" in page.inner_text("#confirm")
    confirm(page)
    page.wait_for_selector("text=Retention changed", timeout=WAIT_MS)
    page.wait_for_selector("#topic >> text=retention 60 min", timeout=WAIT_MS)  # the live view has it
    stats = requests.get(f"{url}/topics/{name}/stats", timeout=5).json()
    assert stats["retention_policy"] == {"type": "Time", "retention_secs": 3600}


def test_a_rooms_limits_are_changed_from_the_topics_page(url: str, page: Page) -> None:
    room = f"room-{uuid.uuid4().hex[:6]}"
    for i in range(5):
        post(url, f"/stream/{room}/publish", {"event": "message", "data": {"i": i}})
    page.goto(url + "/ui/topics")
    page.wait_for_selector(f"tr[data-room='{room}']", timeout=WAIT_MS)
    form = "[data-action=room-retention]"
    page.fill(f"{form} [name=room]", room)
    page.fill(f"{form} [name=max_events]", "2")
    page.check(f"{form} [name=no_age]")
    page.click(f"{form} button[type=submit]")
    confirm(page)
    page.wait_for_selector(f"text=Room {room}: at most 2 events, no age limit.", timeout=WAIT_MS)
    page.wait_for_function(
        "room => document.querySelector(`tr[data-room='${room}']`)?.innerText.includes('2 events')",
        arg=room,
        timeout=WAIT_MS,
    )
    stats = requests.get(f"{url}/stream/{room}/stats", timeout=5).json()
    assert (stats["message_count"], stats["min_offset"], stats["retention_secs"]) == (2, 3, None)


def mesh_of(node: StreamsServerProcess) -> dict[str, Any]:
    answer: dict[str, Any] = requests.get(f"{node.url}/mesh?patterns=1", timeout=5).json()
    return answer


def guaranteed(node: StreamsServerProcess, n: int) -> None:
    for i in range(n):
        post(node.url, "/pubsub/orders.new/publish", {"payload": {"i": i}, "guaranteed": True})


def queued(node: StreamsServerProcess) -> int:
    read = post(node.url, "/topics/orders/partitions/0/consume", {"from_offset": 0, "limit": 100})
    return len(read["events"])


def test_a_queue_is_paused_and_resumed_and_a_departed_node_forgotten(page: Page) -> None:
    with MeshCluster(2, cluster="acts") as mesh:
        a, b = mesh.start().wait_linked()["a"], mesh["b"]
        requests.put(
            f"{b.url}/mesh/queues/orders", json={"patterns": ["orders.>"]}, timeout=5
        ).raise_for_status()
        wait_until(
            lambda: "$G.orders.>" in mesh_of(a)["patterns"]["peers"].get("b", []), what="a knows b's queue"
        )
        guaranteed(a, 2)
        wait_until(lambda: queued(b) == 2, what="b's queue has a's events")

        page.goto(b.url + "/ui/plane")
        row = "#mesh tr[data-queue=orders]"
        page.wait_for_selector(f"{row} >> text=delivering", timeout=WAIT_MS)
        page.click(f"{row} button[data-queue-op=pause]")
        page.wait_for_selector("#confirm[open]", timeout=WAIT_MS)
        page.click("#confirm button[value=cancel]")  # cancelled: still delivering
        assert queued(b) == 2
        page.click(f"{row} button[data-queue-op=pause]")
        confirm(page)
        page.wait_for_selector("text=Queue orders paused.", timeout=WAIT_MS)
        page.wait_for_selector(f"{row} >> text=paused", timeout=WAIT_MS)
        guaranteed(a, 1)
        wait_until(lambda: mesh_of(b)["guaranteed"]["queues"][0]["stored"] == 3, what="b stores while paused")
        assert queued(b) == 0
        page.click(f"{row} button[data-queue-op=resume]")
        confirm(page)
        page.wait_for_selector("text=Queue orders resumed.", timeout=WAIT_MS)
        page.wait_for_selector(f"{row} >> text=delivering", timeout=WAIT_MS)
        assert queued(b) == 3

        page.goto(a.url + "/ui/plane")
        page.wait_for_selector("#mesh tr[data-link=b] >> text=up", timeout=WAIT_MS)
        assert page.query_selector("#mesh button[data-forget]") is None  # a linked node is not offered
        b.stop()
        guaranteed(a, 2)  # spooled for b, which is away
        page.wait_for_selector("#mesh tr[data-spool=b] button[data-forget=b]", timeout=WAIT_MS)
        page.click("#mesh tr[data-spool=b] button[data-forget=b]")
        confirm(page, typed="b")
        page.wait_for_selector("text=Forgot b: 2 spooled events dropped.", timeout=WAIT_MS)
        page.wait_for_selector("#mesh >> text=No spool", timeout=WAIT_MS)
        status = mesh_of(a)
        assert (status["guaranteed"]["spools"], status["counters"]["nodes_forgotten"]) == ([], 1)
        page.goto("about:blank")  # leave before the nodes stop: a live stream cut is not the page's error


def test_the_mesh_view_draws_every_node_of_both_clusters_from_a_node_that_is_no_gateway(
    page: Page, tmp_path: Path
) -> None:
    """east: e1 (gateway to west) and e2; west: w1 (gateway to east), with a queue. Opened on e2."""
    ports = {name: free_port() for name in ("e1", "e2", "w1")}
    url = {name: f"tcp://127.0.0.1:{port}" for name, port in ports.items()}
    extra = {"e1": ("--routes", url["e2"], "--gateway", f"west={url['w1']}"), "e2": ("--routes", url["e1"])}
    extra["w1"] = ("--gateway", f"east={url['e1']}")
    discovery = {"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(tmp_path / "kv")}
    nodes = {
        name: StreamsServerProcess(
            extra_args=(
                *("--node-id", name, "--cluster", "east" if name.startswith("e") else "west"),
                *("--route-port", str(port), "--heartbeat-interval", "0.2", *extra[name]),
            ),
            env=discovery,
        )
        for name, port in ports.items()
    }
    try:
        start_together(*nodes.values())
        requests.put(f"{nodes['w1'].url}/mesh/queues/orders", json={"patterns": ["orders.>"]}, timeout=5)
        page.goto(nodes["e2"].url + "/ui/plane")
        west = "#mesh-view [data-cluster=west] tr[data-node=w1]"
        page.wait_for_selector(f"{west} >> text=orders", timeout=WAIT_MS)  # w1's queue, read from w1
        page.wait_for_function(  # w1's gateway to east, up
            "sel => /east\\s*up/.test(document.querySelector(sel)?.innerText || '')",
            arg=west,
            timeout=WAIT_MS,
        )
        e1 = "#mesh-view [data-cluster=east] tr[data-node=e1]"
        page.wait_for_function(  # e1's link to e2 and its gateway to west
            "sel => /e2\\s*up/.test(document.querySelector(sel)?.innerText || '') && "
            "/west\\s*up/.test(document.querySelector(sel)?.innerText || '')",
            arg=e1,
            timeout=WAIT_MS,
        )
        assert "(this one)" in page.inner_text("#mesh-view [data-cluster=east] tr[data-node=e2]")
        page.goto("about:blank")  # leave before the nodes stop
    finally:
        for node in nodes.values():
            node.cleanup()


# --- Message VPNs: the VPN picker (issue 58) --------------------------------------------------------

VPN_A_TOKEN = "dashboard-team-a-token-1"


@pytest.fixture(scope="module")
def with_vpns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("vpns")
    (root / "vpns.toml").write_text("[vpns.team-a]\n")
    (root / "tokens").write_text(f"{TOKEN} admin\n{VPN_A_TOKEN} vpn:team-a read\n")
    args = ("--mesh-vpns", str(root / "vpns.toml"), "--token-file", str(root / "tokens"))
    with StreamsServerProcess(extra_args=args) as proc:
        base = proc.start().url
        post(base, "/topics/default-only", {"num_partitions": 1}, token=TOKEN)
        headers = {"Authorization": f"Bearer {TOKEN}", "X-Meshplane-Vpn": "team-a"}
        requests.post(f"{base}/topics/team-a-only", json={"num_partitions": 1}, headers=headers, timeout=5)
        yield base


def _sign_in(browser: Browser, url: str, token: str) -> Page:
    page = browser.new_context().new_page()
    page.goto(url + "/ui/topics")
    page.wait_for_selector("#login[open]", timeout=WAIT_MS)
    page.fill("#token", token)
    page.click("#login button[type=submit]")
    page.wait_for_selector("#status.live", timeout=WAIT_MS)
    return page


def test_the_vpn_picker_shows_each_vpns_topics_and_a_tenant_only_its_own(
    with_vpns: str, browser: Browser
) -> None:
    page = _sign_in(browser, with_vpns, TOKEN)
    page.wait_for_selector("tr[data-topic=default-only]", timeout=WAIT_MS)
    assert page.is_visible("#vpn")
    assert page.eval_on_selector_all("#vpn option", "os => os.map(o => o.value)") == ["default", "team-a"]
    page.select_option("#vpn", "team-a")
    page.wait_for_selector("tr[data-topic=team-a-only]", timeout=WAIT_MS)
    assert page.query_selector("tr[data-topic=default-only]") is None
    page.context.close()
    tenant = _sign_in(browser, with_vpns, VPN_A_TOKEN)
    tenant.wait_for_selector("tr[data-topic=team-a-only]", timeout=WAIT_MS)
    assert not tenant.is_visible("#vpn")  # one VPN: nothing to pick
    assert tenant.query_selector("tr[data-topic=default-only]") is None
    tenant.context.close()
