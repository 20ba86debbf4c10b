"""The streams token file (lines and TOML), each token's VPN, and where each VPN's streams live."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshplane.errors import ConfigError
from meshplane.streams.access import Tokens
from meshplane.streams.grants import Scope
from meshplane.streams.token_file import check_tokens
from meshplane.streams.vpn_engines import vpn_data_dir

T1, T2 = "a" * 16, "b" * 20
VPNS = ("default", "team-a")


@pytest.mark.parametrize(
    ("text", "toml", "expected"),
    [
        (f"{T1}\n", False, {T1: ("default", (Scope("admin"),))}),
        (f"{T1} vpn:team-a read:orders.\n", False, {T1: ("team-a", (Scope("read", "orders."),))}),
        (
            f"# c\n{T1} read vpn:team-a  # note\n{T2} write\n",
            False,
            {
                T1: ("team-a", (Scope("read"),)),
                T2: ("default", (Scope("write"),)),
            },
        ),
        (
            f'[tokens.x]\ntoken = "{T1}"\nvpn = "team-a"\nscopes = ["read"]\n',
            True,
            {
                T1: ("team-a", (Scope("read"),)),
            },
        ),
        (
            f'[tokens.x]\ntoken = "{T1}"\n[tokens.y]\ntoken = "{T2}"\nscopes = ["admin:x"]\n',
            True,
            {
                T1: ("default", (Scope("admin"),)),
                T2: ("default", (Scope("admin", "x"),)),
            },
        ),
    ],
)
def test_each_token_gets_its_vpn_and_scopes(
    text: str, toml: bool, expected: dict[str, tuple[str, tuple[Scope, ...]]]
) -> None:
    entries, problems = check_tokens(text, toml=toml, vpns=VPNS)
    assert problems == []
    assert {e.token: (e.grant.vpn, e.grant.scopes) for e in entries} == expected


@pytest.mark.parametrize(
    ("text", "toml", "line", "message"),
    [
        (f"{T1} vpn:team-z\n", False, 1, "unknown VPN 'team-z'"),
        (f"\n{T1} vpn:a vpn:b\n", False, 2, "one vpn:NAME at most"),
        (f"{T1} vpn:$bad\n", False, 1, "VPN name"),
        ("short vpn:team-a\n", False, 1, "at least 16"),
        (f"{T1} root\n", False, 1, "unknown scope"),
        (f'[tokens.x]\ntoken = "{T1}"\n\nvpn = "team-z"\n', True, 4, "unknown VPN 'team-z'"),
        (f'[tokens.x]\ntoken = "{T1}"\nvpn = 3\n', True, 3, "vpn is a name"),
        ('[tokens.x]\ntoken = "short"\n', True, 2, "at least 16"),
        (f'[tokens.x]\ntoken = "{T1}"\nscope = ["read"]\n', True, 3, "unknown key 'scope'"),
        (f'[tokenz.x]\ntoken = "{T1}"\n', True, 1, "only [tokens.NAME]"),
        ('[tokens.x\ntoken = "x"\n', True, 1, "not TOML"),
    ],
)
def test_every_mistake_is_said_with_its_line(text: str, toml: bool, line: int, message: str) -> None:
    _, problems = check_tokens(text, toml=toml, vpns=VPNS)
    assert problems, text
    assert problems[0].line == line
    assert message in problems[0].message
    assert T1 not in problems[0].message  # a token is never said


_names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}", fullmatch=True)
_tokens = st.from_regex(r"[A-Za-z0-9]{16,40}", fullmatch=True)


@given(st.dictionaries(_tokens, _names, min_size=1, max_size=5))
def test_both_forms_give_each_token_its_vpn(tokens: dict[str, str]) -> None:
    lines = "".join(f"{token} vpn:{vpn} read\n" for token, vpn in tokens.items())
    toml = "".join(
        f'[tokens.t{n}]\ntoken = "{token}"\nvpn = "{vpn}"\nscopes = ["read"]\n'
        for n, (token, vpn) in enumerate(tokens.items())
    )
    for text, is_toml in ((lines, False), (toml, True)):
        entries, problems = check_tokens(text, toml=is_toml, vpns=set(tokens.values()))
        assert problems == []
        assert {e.token: e.grant.vpn for e in entries} == tokens
    parsed = Tokens.parse(lines)
    for token, vpn in tokens.items():
        grant = parsed.grant_for(token)
        assert grant is not None
        assert grant.vpn == vpn
        assert not grant.operator  # a read token, or another VPN's


def test_the_operator_is_the_default_vpns_unscoped_admin() -> None:
    parsed = Tokens.parse(f"{T1}\n{T2} vpn:team-a\n{'c' * 16} admin:x\n")
    assert [parsed.grant_for(t).operator for t in (T1, T2, "c" * 16)] == [True, False, False]  # type: ignore[union-attr]


def test_a_server_refuses_a_token_of_a_vpn_it_lacks(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{T1}\n{T2} vpn:team-b\n")
    with pytest.raises(ConfigError, match=r"tokens:2: unknown VPN 'team-b'"):
        Tokens.load(path, None, VPNS)


@given(_names, _names)
def test_each_vpn_has_a_directory_of_its_own_beside_the_default_vpns_objects(one: str, other: str) -> None:
    root = Path("/data")
    where = vpn_data_dir(root, one)
    if one == "default":
        assert where == root  # a server that names no VPN keeps its layout
        return
    assert where.parent == root / "vpns"
    for kind in ("topics", "rooms", "groups", "staging"):  # never inside the default VPN's objects
        assert not where.is_relative_to(root / kind)
    assert (where == vpn_data_dir(root, other)) == (one == other)


def test_a_vpn_name_that_could_leave_its_directory_is_refused() -> None:
    for bad in ("..", "../x", "a/b", "", "-x"):
        with pytest.raises(ValueError, match="VPN name"):
            vpn_data_dir(Path("/data"), bad)
