"""A reviewer's attacks on the streams API's authorisation:

1. A read-only token rewound a consumer group's committed offsets: a commit without a member (the
   dashboard's "reset offsets") needed only read. It needs admin now.
2. Cross-site requests: with no tokens (the loopback default) a web page the operator visits created or
   deleted topics with a CORS "simple" request (a ``text/plain`` body, no preflight). A request from
   another site's page that changes something is refused now.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from meshplane.launchers import StreamsServerProcess

ADMIN = "attack-admin-token-1"
READ = "attack-read-token-2"


def _post(url: str, path: str, body: dict[str, Any], token: str) -> requests.Response:
    return requests.post(url + path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=5)


@pytest.fixture(scope="module")
def scoped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tokens: Path = tmp_path_factory.mktemp("tokens") / "tokens"
    tokens.write_text(f"{ADMIN} admin\n{READ} read\n")
    with StreamsServerProcess(extra_args=("--token-file", str(tokens))) as proc:
        yield proc.start().url


def test_a_read_token_cannot_reset_a_groups_offsets(scoped: str) -> None:
    _post(scoped, "/topics/ledger", {"num_partitions": 1}, ADMIN).raise_for_status()
    events = [{"event_type": "e", "data": {"i": i}} for i in range(5)]
    _post(scoped, "/topics/ledger/publish", {"events": events, "partition": 0}, ADMIN).raise_for_status()
    _post(scoped, "/consumer-groups/billing", {"topic": "ledger"}, ADMIN).raise_for_status()
    _post(scoped, "/consumer-groups/billing/offsets/commit", {"partition_id": 0, "offset": 5}, ADMIN)
    # The read token moves the group back to 0: every event is billed again.
    answer = _post(scoped, "/consumer-groups/billing/offsets/commit", {"partition_id": 0, "offset": 0}, READ)
    committed = requests.get(
        scoped + "/consumer-groups/billing/offsets/0", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=5
    ).json()["offset"]
    assert answer.status_code == 403, (answer.status_code, answer.text, committed)
    assert committed == 5


@pytest.fixture(scope="module")
def open_server() -> Iterator[str]:
    with StreamsServerProcess() as proc:
        yield proc.start().url


def test_a_cross_site_simple_request_cannot_delete_a_topic(open_server: str) -> None:
    requests.post(open_server + "/topics/precious", json={"num_partitions": 1}, timeout=5).raise_for_status()
    # What <form enctype=text/plain> or fetch(..., {mode: "no-cors"}) sends from https://evil.example
    hostile = {"Origin": "https://evil.example", "Content-Type": "text/plain"}
    body = '{"num_partitions": 1}'
    made = requests.post(open_server + "/topics/planted", data=body, headers=hostile, timeout=5)
    gone = requests.delete(open_server + "/topics/precious", headers={"Origin": hostile["Origin"]}, timeout=5)
    names = requests.get(open_server + "/topics", timeout=5).text
    assert made.status_code >= 400, (made.status_code, made.text)
    assert gone.status_code >= 400, (gone.status_code, names)
    assert "precious" in names
