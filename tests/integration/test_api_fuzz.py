"""Schemathesis over the streams API's own OpenAPI description: generated requests to every route of a
real server; none may get a 5xx, and every refusal is a JSON error. Most requests name a topic, room,
group and partition that exist (made again when a fuzzed DELETE took them), so the bodies and queries
are checked by the handlers, not refused as not found. A bounded number of examples in CI;
MESHPLANE_FUZZ_EXAMPLES for more."""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings

from meshplane.launchers import StreamsServerProcess
from meshplane.streams.http.api import Api
from meshplane.streams.http.openapi import openapi_document
from meshplane.streams.http.routes import route_table
from meshplane.streams.service import StreamsConfig, StreamsService

# The description is static (one route table), so it is built here rather than fetched.
schema = schemathesis.openapi.from_dict(openapi_document(route_table(Api(StreamsService(StreamsConfig())))))
EXAMPLES = int(os.environ.get("MESHPLANE_FUZZ_EXAMPLES", "15"))
# In a pytest-xdist worker schemathesis folds every route into one test, which sent 10 requests in all
# (one at a time, every route gets up to 15 examples): make check runs this module first, alone.
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def server() -> Iterator[StreamsServerProcess]:
    with StreamsServerProcess(extra_args=("--max-payload-bytes", "65536", "--body-timeout", "2")) as proc:
        yield proc.start()


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as http:
        yield http


# Path parameters that name live resources: a fuzzed name would mostly reach only the 404 path.
LIVE = {"topic": "fuzz-topic", "room": "fuzz-room", "group": "fuzz-group", "partition": 0}
ANSWERS: Counter[str] = Counter()  # "live" or "made-up" requests, and those answered 404
READS = {"GET", "HEAD", "OPTIONS"}
# Whether a request that could remove them went since ``ensure_live`` made sure of them (a read cannot).
MAYBE_GONE = [True]


def ensure_live(url: str, http: requests.Session) -> None:
    """The resources ``LIVE`` names exist, with events (a fuzzed DELETE may have removed them)."""
    if not MAYBE_GONE[0]:
        return
    MAYBE_GONE[0] = False
    if http.get(f"{url}/topics/fuzz-topic/stats", timeout=10).status_code == 404:
        http.post(f"{url}/topics/fuzz-topic", json={"num_partitions": 2}, timeout=10).raise_for_status()
        events: list[Any] = [{"event_type": "e", "data": {"i": i}, "key": f"k{i}"} for i in range(10)]
        http.post(f"{url}/topics/fuzz-topic/publish", json={"events": events}, timeout=10).raise_for_status()
    if http.get(f"{url}/consumer-groups/fuzz-group/stats", timeout=10).status_code == 404:
        http.post(f"{url}/consumer-groups/fuzz-group", json={"topic": "fuzz-topic"}, timeout=10)
    http.post(f"{url}/stream/fuzz-room/publish", json={"event": "e", "data": 1}, timeout=10)


# WebSocket and SSE routes hold the connection open: the hostile-client and dashboard tests cover them.
@schema.exclude(path_regex=r"(/ws|/events/|/ui/api/live)").parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
def test_no_request_gets_a_server_error(
    case: schemathesis.Case[Any], server: StreamsServerProcess, session: requests.Session
) -> None:
    live = bool(case.path_parameters) and random.Random(repr(case.path_parameters)).random() < 0.8
    if live:
        ensure_live(server.url, session)
        for name in case.path_parameters or {}:
            if name in LIVE:
                case.path_parameters[name] = LIVE[name]
    MAYBE_GONE[0] = MAYBE_GONE[0] or case.method.upper() not in READS
    response = case.call(base_url=server.url, session=session, timeout=10)
    where = f"{case.method} {case.formatted_path}: {response.status_code} {response.content[:300]!r}"
    assert response.status_code < 500, where
    if response.status_code >= 400 and response.status_code != 401:
        assert "error" in response.json(), where  # a refusal says why, as JSON
    kind = "live" if live else "made-up"
    ANSWERS[kind] += 1
    ANSWERS[f"{kind} 404"] += response.status_code == 404


def test_the_fuzzer_reached_live_resources() -> None:
    """Runs after the fuzzing above (file order): most of its requests got past "not found"."""
    assert ANSWERS["live"] >= 50, ANSWERS
    assert ANSWERS["live 404"] < ANSWERS["live"] / 2, ANSWERS
