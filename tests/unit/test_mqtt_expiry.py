"""MQTT 5's Message Expiry Interval on the mesh (meshplane.core.doors.mqtt_expiry): the deadline
carried in the NATS envelope's headers, read back from any body, and the seconds left."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from meshplane.core.doors.mqtt_expiry import (
    MAX_INTERVAL,
    deadline_of,
    expiry_headers,
    payload_of,
    seconds_left,
)
from meshplane.core.doors.nats_protocol import wrap
from meshplane.core.mesh.frames import FLAG_JSON_MESSAGE, FLAG_NATS_ENVELOPE

deadlines = st.integers(0, 2**62)


@given(deadlines, st.binary(max_size=100))
def test_a_deadline_travels_with_its_payload(deadline: int, payload: bytes) -> None:
    body = wrap("", expiry_headers(deadline), payload)
    assert payload_of(body, FLAG_NATS_ENVELOPE) == (payload, deadline)
    assert payload_of(body, 0, queued=True) == (payload, deadline)  # a queue keeps no flags
    assert payload_of(body, 0) == (body, None)  # without the flag, an MQTT payload as it came


@given(st.binary(max_size=200))
def test_any_body_gives_a_payload_and_no_deadline_it_does_not_carry(body: bytes) -> None:
    payload, deadline = payload_of(body, 0, queued=True)
    assert isinstance(payload, bytes)
    assert deadline is None or deadline >= 0
    if deadline is None and not body.startswith(b"NATS\x01"):
        assert payload == body


@given(st.binary(max_size=60))
def test_headers_without_a_number_carry_no_deadline(junk: bytes) -> None:
    headers = b"NATS/1.0\r\nMqtt-Expires: x" + junk.replace(b"\r", b"") + b"\r\n\r\n"
    assert deadline_of(headers) is None
    assert deadline_of(b"NATS/1.0\r\nOther: 5\r\n\r\n") is None


@given(deadlines, deadlines)
def test_seconds_left_round_up_and_reach_zero_at_the_deadline(deadline: int, now: int) -> None:
    left = seconds_left(deadline, now)
    if now >= deadline:
        assert left == 0
    elif left == MAX_INTERVAL:  # the largest interval MQTT's four bytes hold
        assert deadline - now > (MAX_INTERVAL - 1) * 1000
    else:
        assert left >= 1
        assert (left - 1) * 1000 < deadline - now <= left * 1000


def test_a_pub_sub_message_gives_its_payload_as_json() -> None:
    body = msgspec.json.encode({"payload": {"a": 1}})
    assert payload_of(body, FLAG_JSON_MESSAGE) == (b'{"a":1}', None)
