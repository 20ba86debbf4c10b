"""Schemathesis over the streams API's own OpenAPI description: generated requests to every route of a
real server; none may get a 5xx. A bounded number of examples in CI; MESHPLANE_FUZZ_EXAMPLES for more."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings

from meshplane.launchers import StreamsServerProcess
from meshplane.streams.http.api import Api
from meshplane.streams.http.routes import openapi_document, route_table
from meshplane.streams.service import StreamsConfig, StreamsService

# The description is static (one route table), so it is built here rather than fetched.
schema = schemathesis.openapi.from_dict(openapi_document(route_table(Api(StreamsService(StreamsConfig())))))
EXAMPLES = int(os.environ.get("MESHPLANE_FUZZ_EXAMPLES", "15"))


@pytest.fixture(scope="module")
def server() -> Iterator[StreamsServerProcess]:
    with StreamsServerProcess(extra_args=("--max-payload-bytes", "65536", "--body-timeout", "2")) as proc:
        yield proc.start()


@pytest.fixture(scope="module")
def session() -> Iterator[requests.Session]:
    with requests.Session() as http:
        yield http


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
    response = case.call(base_url=server.url, session=session, timeout=10)
    assert response.status_code < 500, (
        f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:300]}"
    )
