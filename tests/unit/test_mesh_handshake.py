"""The mesh handshake's proofs, the interest version ceiling and the peers' queue log: pure parts of
issue 34's defences."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.mesh.handshake import (
    NONCE_BYTES,
    Auth,
    decode_auth,
    encode_auth,
    new_nonce,
    new_origin,
    origin_ticket,
    proof,
    resumed_origin,
)
from meshplane.core.mesh.interest import VERSION_SLACK, version_ceiling
from meshplane.mesh.peer_queues import COMPACT_AFTER, Change, PeerQueuesLog

FIELDS = {
    "dialler_nonce": b"d" * NONCE_BYTES,
    "node_nonce": b"n" * NONCE_BYTES,
    "role": "route",
    "dialler_id": "a",
    "node_id": "b",
}


@given(data=st.data(), field=st.sampled_from(sorted(FIELDS)))
def test_a_proof_changes_with_every_field_it_covers(data: st.DataObject, field: str) -> None:
    original = FIELDS[field]
    values = st.binary(max_size=40) if isinstance(original, bytes) else st.text(min_size=1, max_size=16)
    changed = data.draw(values.filter(lambda value: value != original), label=field)
    base = proof("s", dialler=True, **FIELDS)  # type: ignore[arg-type]
    assert proof("s", dialler=True, **{**FIELDS, field: changed}) != base  # type: ignore[arg-type]


def test_a_proof_is_bound_to_its_side_and_secret() -> None:
    dialler = proof("s", dialler=True, **FIELDS)  # type: ignore[arg-type]
    assert proof("s", dialler=False, **FIELDS) != dialler  # type: ignore[arg-type]
    assert proof("t", dialler=True, **FIELDS) != dialler  # type: ignore[arg-type]
    assert proof("", dialler=True, **FIELDS) != dialler  # type: ignore[arg-type]
    assert len(dialler) == 32
    assert new_nonce() != new_nonce()


@given(st.binary(max_size=200))
def test_any_auth_payload_decodes_or_is_a_value_error(payload: bytes) -> None:
    try:
        auth = decode_auth(payload)
    except ValueError:
        return
    assert decode_auth(encode_auth(auth)) == auth


def test_auth_round_trips() -> None:
    assert decode_auth(encode_auth(Auth(b"p" * 32, "origin"))) == Auth(b"p" * 32, "origin")


@given(known=st.integers(0, 2**40), epoch=st.integers(0, 2**62), now=st.integers(0, 2**62))
def test_the_version_ceiling(known: int, epoch: int, now: int) -> None:
    ceiling = version_ceiling(known, epoch, now)
    assert ceiling >= known + (VERSION_SLACK if known else 0)
    if known:
        assert ceiling == known + VERSION_SLACK  # far ahead of the last version: refused
    else:
        assert ceiling <= max(0, now - epoch) // 1000 + VERSION_SLACK  # at most one a microsecond
    assert version_ceiling(known, epoch, epoch + 3600 * 10**9) < 2**62  # an hour old: no tombstone of 2^62


def test_the_peer_queue_log_survives_a_torn_line_forgets_and_compacts(tmp_path: Path) -> None:
    log = PeerQueuesLog(tmp_path)
    state: dict[str, set[str]] = {}
    for peer, add, remove in (("a", ["x.>"], []), ("b", ["y.*"], []), ("a", ["z"], ["x.>"])):
        PeerQueuesLog._apply(state, Change(peer, add, remove))
        log.append(Change(peer, add, remove), state)
    state.pop("b")
    log.append(Change("b", forget=True), state)
    log.close()
    with log.path.open("ab") as torn:
        torn.write(b'{"peer": "c", "add": ["w')
    assert PeerQueuesLog(tmp_path).load() == {"a": {"z"}}
    big = PeerQueuesLog(tmp_path)
    state = big.load()
    for i in range(COMPACT_AFTER + 10):
        PeerQueuesLog._apply(state, Change("a", [f"p{i % 3}"], [f"p{(i + 1) % 3}"]))
        big.append(Change("a", [f"p{i % 3}"], [f"p{(i + 1) % 3}"]), state)
    big.close()
    assert len(big.path.read_bytes().splitlines()) < COMPACT_AFTER  # rewritten once it grew long
    assert PeerQueuesLog(tmp_path).load() == state


def test_the_whole_file_of_older_versions_is_read_once(tmp_path: Path) -> None:
    (tmp_path / "peer_queues.json").write_text('{"a": ["x.>"]}')
    assert PeerQueuesLog(tmp_path).load() == {"a": {"x.>"}}
    assert not (tmp_path / "peer_queues.json").exists()
    assert PeerQueuesLog(tmp_path).load() == {"a": {"x.>"}}


@pytest.mark.parametrize("payload", [b"", b"\x91\x01", b"\x81\xa5proof\x01"])
def test_malformed_auth_is_a_value_error(payload: bytes) -> None:
    with pytest.raises(ValueError, match="AUTH"):
        decode_auth(payload)


def test_a_client_keeps_its_origin_only_with_the_ticket_a_node_made_for_it() -> None:
    origin = new_origin()
    ticket = origin_ticket("members", origin)
    assert resumed_origin("members", origin, ticket) == origin
    for other_origin, other_ticket, secret in (
        (new_origin(), ticket, "members"),  # another client's origin, this ticket
        (origin, ticket[:-1] + bytes([ticket[-1] ^ 1]), "members"),  # a forged ticket
        (origin, ticket, "another secret"),  # made by a node of another mesh
        ("n0", origin_ticket("members", "n0"), "members"),  # a node id, not a client's origin
    ):
        assert resumed_origin(secret, other_origin, other_ticket) != other_origin
