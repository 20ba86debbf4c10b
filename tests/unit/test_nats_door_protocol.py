"""The NATS door's codec, sans I/O (meshplane.core.doors.nats_protocol): every operation read back as
it was encoded, split anywhere; arbitrary bytes only ever give NatsProtocolError; the limits hold."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from meshplane.cli.config_file import read_config, settings_of
from meshplane.cli.main import build_parser
from meshplane.cli.options import subcommands
from meshplane.cli.serve_rules import RULES
from meshplane.core.doors.nats_groups import InvalidGroup, check_group, chosen, marker
from meshplane.core.doors.nats_protocol import (
    CONTROL_LINE_EXCEEDED,
    PAYLOAD_VIOLATION,
    PING,
    PONG,
    Connect,
    Err,
    Info,
    Msg,
    NatsParser,
    NatsProtocolError,
    Ok,
    Op,
    Ping,
    Pong,
    Pub,
    Sub,
    Unsub,
    encode_connect,
    encode_err,
    encode_info,
    encode_msg,
    encode_pub,
    encode_sub,
    encode_unsub,
    status_headers,
    unwrap,
    wrap,
)
from meshplane.core.doors.nats_subs import SubscriptionLimit, Subscriptions

token = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-$", min_size=1, max_size=12)
subjects = st.lists(token, min_size=1, max_size=5).map(".".join)
maybe_subject = st.one_of(st.just(""), subjects)
headers = st.lists(st.tuples(token, token), max_size=3).map(
    lambda pairs: b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in pairs) + b"\r\n"
)
options: st.SearchStrategy[dict[str, object]] = st.dictionaries(
    token, st.one_of(st.booleans(), st.integers(), token), max_size=4
)


@st.composite
def operations(draw: st.DrawFn) -> tuple[Op, bytes]:
    kind = draw(
        st.sampled_from(
            ["pub", "hpub", "msg", "hmsg", "sub", "unsub", "ping", "pong", "connect", "info", "ok", "err"]
        )
    )
    payload = draw(st.binary(max_size=64))
    if kind in ("pub", "hpub"):
        subject, reply = draw(subjects), draw(maybe_subject)
        block = draw(headers) if kind == "hpub" else None
        return Pub(subject, reply, payload, block), encode_pub(subject, reply, payload, block)
    if kind in ("msg", "hmsg"):
        subject, sid, reply = draw(subjects), draw(token), draw(maybe_subject)
        block = draw(headers) if kind == "hmsg" else None
        return Msg(subject, sid, reply, payload, block), encode_msg(subject, sid, reply, payload, block)
    if kind == "sub":
        subject, queue, sid = draw(subjects), draw(st.one_of(st.just(""), token)), draw(token)
        return Sub(subject, queue, sid), encode_sub(subject, queue, sid)
    if kind == "unsub":
        sid, most = draw(token), draw(st.one_of(st.none(), st.integers(0, 10**9)))
        return Unsub(sid, most), encode_unsub(sid, most)
    if kind in ("connect", "info"):
        given_options: dict[str, object] = draw(options)
        if kind == "connect":
            return Connect(given_options), encode_connect(given_options)
        return Info(given_options), encode_info(given_options)
    if kind == "err":
        message = draw(st.text(alphabet="abcdefghij ", min_size=1, max_size=20)).strip() or "x"
        return Err(message), encode_err(message)
    plain: dict[str, tuple[Op, bytes]] = {
        "ping": (Ping(), PING),
        "pong": (Pong(), PONG),
        "ok": (Ok(), b"+OK\r\n"),
    }
    return plain[kind]


@given(st.lists(operations(), max_size=8), st.lists(st.integers(0, 2000), max_size=6))
def test_operations_read_back_as_encoded_split_anywhere(ops: list[tuple[Op, bytes]], cuts: list[int]) -> None:
    stream = b"".join(raw for _, raw in ops)
    parser = NatsParser(max_payload=1024)
    read: list[Op] = []
    start = 0
    for cut in [*sorted(c % (len(stream) + 1) for c in cuts), len(stream)]:
        read += parser.feed(stream[start:cut])
        start = cut
    assert read == [op for op, _ in ops]
    assert parser.buffered == 0


@given(st.binary(max_size=600), st.integers(1, 64))
@example(b"PUB a 5\r\nhelloX", 3)
@example(b"HPUB a 2 1\r\nxx\r\n", 1)
@example(b"CONNECT [1]\r\n", 4)
@example(b"UNSUB 1 -1\r\n", 4)
@example(b"SUB\r\n", 1)
@example(b"\xff\xfe\r\n", 1)
def test_any_bytes_give_operations_or_the_codecs_error(data: bytes, step: int) -> None:
    parser = NatsParser(max_control=128, max_payload=64)
    try:
        for start in range(0, len(data), step):
            parser.feed(data[start : start + step])
    except NatsProtocolError as exc:
        message = exc.message  # nats-server's -ERR text
        with pytest.raises(NatsProtocolError):  # a broken stream stays broken
            parser.feed(b"PING\r\n")
    else:
        message = "read"
    assert message
    assert parser.buffered <= 128 + 64 + 2


@given(
    st.lists(operations(), min_size=1, max_size=6), st.integers(0, 10**6), st.binary(min_size=1, max_size=4)
)
def test_valid_streams_with_bytes_changed_give_operations_or_the_codecs_error(
    ops: list[tuple[Op, bytes]], where: int, garbage: bytes
) -> None:
    stream = bytearray(b"".join(raw for _, raw in ops))
    at = where % len(stream)
    stream[at : at + len(garbage)] = garbage
    parser = NatsParser(max_control=256, max_payload=128)
    try:
        parser.feed(bytes(stream))
    except NatsProtocolError as exc:
        message = exc.message
    else:
        message = "read"
    assert message


def test_a_control_line_over_the_limit_is_refused_before_its_end() -> None:
    parser = NatsParser(max_control=4096)
    parser.feed(b"SUB " + b"a" * 4000)
    with pytest.raises(NatsProtocolError) as caught:
        parser.feed(b"a" * 200)  # no CRLF yet: refused without waiting for one
    assert caught.value.message == CONTROL_LINE_EXCEEDED


def test_a_payload_over_max_payload_is_refused_at_its_control_line() -> None:
    parser = NatsParser(max_payload=100)
    with pytest.raises(NatsProtocolError) as caught:
        parser.feed(b"PUB a 101\r\n")
    assert caught.value.message == PAYLOAD_VIOLATION
    with pytest.raises(NatsProtocolError):  # the connection is closed: nothing after it is read
        parser.feed(b"PING\r\n")


@pytest.mark.parametrize(
    "line",
    [b"PUB a\r\n", b"PUB a b c 1\r\n", b"PUB a x\r\n", b"HPUB a 9 3\r\n", b"SUB a\r\n", b"NOPE\r\n", b"\r\n"],
)
def test_broken_operations_are_unknown_protocol_operations(line: bytes) -> None:
    with pytest.raises(NatsProtocolError, match="Unknown Protocol Operation"):
        NatsParser().feed(line)


def test_verbs_are_case_insensitive_and_tabs_separate() -> None:
    assert NatsParser().feed(b"pub\ta  2\r\nhi\r\nping\r\n") == [Pub("a", "", b"hi"), Ping()]


@given(maybe_subject, st.one_of(st.none(), headers), st.binary(max_size=64))
def test_an_envelope_carries_reply_and_headers(reply: str, block: bytes | None, payload: bytes) -> None:
    assert unwrap(wrap(reply, block, payload)) == (reply, block, payload)


@given(st.binary(max_size=64))
def test_a_body_that_is_no_envelope_is_all_payload(body: bytes) -> None:
    reply, block, payload = unwrap(body)
    assert (reply, block, payload) == ("", None, body) or body.startswith(b"NATS\x01")


@given(st.text(max_size=40).filter(lambda r: any(c.isspace() or not c.isprintable() for c in r)))
@example("x 5\r\nhi\r\nMSG forged 1 4")
def test_an_envelope_whose_reply_is_no_subject_is_all_payload(reply: str) -> None:
    """Anyone on the mesh can set the envelope flag: a reply that would break a MSG line is refused."""
    body = wrap(reply, None, b"p")
    assert unwrap(body) == ("", None, body)


def test_status_headers_are_a_header_block() -> None:
    parser = NatsParser()
    block = status_headers(503)
    assert parser.feed(encode_msg("_INBOX.x", "1", "", b"", block)) == [Msg("_INBOX.x", "1", "", b"", block)]


# --- subscriptions -------------------------------------------------------------------------------------


def test_unsub_max_removes_after_that_many_deliveries() -> None:
    subs = Subscriptions(10)
    assert subs.add("1", "a.*")
    assert not subs.add("2", "a.*")  # the node holds the pattern once
    assert subs.unsub("1", 2) is None
    for _ in range(2):
        for sub in subs.matching("a.b"):
            dropped = subs.expired(sub)
    assert "1" not in subs.by_sid
    assert dropped is None  # "2" still holds a.*
    assert subs.unsub("2", None) == "a.*"
    assert subs.matching("a.b") == []


def test_unsub_max_already_reached_removes_at_once() -> None:
    subs = Subscriptions(10)
    subs.add("1", "x")
    subs.matching("x")
    assert subs.unsub("1", 1) == "x"


def test_subscriptions_are_bounded() -> None:
    subs = Subscriptions(2)
    subs.add("1", "a")
    subs.add("2", "b")
    with pytest.raises(SubscriptionLimit):
        subs.add("3", "c")
    with pytest.raises(ValueError, match="taken"):
        subs.add("1", "d")


# --- queue groups ----------------------------------------------------------------------------------------


@given(st.sets(st.sampled_from("abcdefgh"), min_size=1), st.text(max_size=8), st.integers(0, 2**63))
def test_every_node_with_the_same_view_chooses_the_same_one(nodes: set[str], source: str, seq: int) -> None:
    choices = {chosen(set(nodes), source, seq) for _ in nodes}
    assert len(choices) == 1
    assert choices <= nodes


def test_the_choice_spreads_events_over_the_nodes() -> None:
    picks = Counter(chosen({"a", "b", "c"}, "a", seq) for seq in range(3000))
    assert set(picks) == {"a", "b", "c"}
    assert min(picks.values()) > 800


@pytest.mark.parametrize("name", ["", "a.b", "*", ">", "x" * 65, "sp ace"])
def test_group_names_the_mesh_cannot_carry_are_refused(name: str) -> None:
    with pytest.raises(InvalidGroup):
        check_group(name)
    assert marker(check_group("workers"), "orders.*") == "$NQ.workers.orders.*"


# --- configuration ---------------------------------------------------------------------------------------


def test_the_nats_section_of_a_config_file_sets_nats_port(tmp_path: Path) -> None:
    serve = subcommands(build_parser())["serve"]
    path = tmp_path / "serve.toml"
    path.write_text('[mesh]\nnode_id = "a"\n[nats]\nport = 4333\n')
    config = read_config(path, serve)
    assert config.problems == []
    assert config.values == {"node_id": "a", "nats_port": 4333}
    assert settings_of(serve)[("nats", "port")].flag == "--nats-port"


def test_nats_port_needs_a_node_id() -> None:
    serve = subcommands(build_parser())["serve"]
    args = serve.parse_args(["--nats-port", "4222"])
    problems = [rule(args, lambda dest: f"--{dest.replace('_', '-')}") for rule in RULES]
    assert any(p is not None and "--nats-port needs --node-id" in p.message for p in problems)


def test_a_door_that_would_take_anyone_is_refused_where_mesh_clients_prove_a_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from meshplane.errors import ConfigError
    from meshplane.mesh.config import MeshConfig
    from meshplane.mesh.doors.nats import TOKEN_ENV
    from meshplane.mesh.node import MeshNode

    monkeypatch.delenv(TOKEN_ENV, raising=False)

    def config() -> MeshConfig:
        return MeshConfig(node_id="a", nats_port=0, secret="members", client_secret="clients")

    with pytest.raises(ConfigError, match=TOKEN_ENV):
        MeshNode(config())
    monkeypatch.setenv(TOKEN_ENV, "a-token")
    assert MeshNode(config()).nats is not None
