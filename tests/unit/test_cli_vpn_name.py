"""A VPN name given to the streams client (``--vpn``, ``$MESHPLANE_STREAMS_VPN``, a context, the
library) is checked before any request: a line break or a stray name never reaches a header."""

from __future__ import annotations

import pytest

from meshplane.streams.client import StreamsClient
from meshplane.streams.errors import StreamError
from tests.support.cli import clean_env, run_cli

NOWHERE = "http://127.0.0.1:9"  # nothing listens: a name let through would fail on the connection instead


@pytest.mark.parametrize("name", ["bad name!", "a\r\nX-Injected: 1", "", "-lead", "x" * 33])
async def test_the_library_refuses_a_name_no_vpn_can_have(name: str) -> None:
    with pytest.raises(StreamError, match="VPN name"):
        StreamsClient(NOWHERE, vpn=name)


async def test_the_library_takes_a_vpn_name() -> None:
    client = StreamsClient(NOWHERE, vpn="tenant_A-1")
    await client.close()


def test_the_cli_refuses_a_bad_vpn_from_the_option_and_from_the_environment() -> None:
    given = run_cli("topic", "list", "--vpn", "bad name!", "--url", NOWHERE, env=clean_env())
    assert given.returncode == 2, given.stderr
    assert "argument --vpn: VPN name 'bad name!'" in given.stderr
    from_env = run_cli(
        "topic", "list", "--url", NOWHERE, env={**clean_env(), "MESHPLANE_STREAMS_VPN": "a\nb"}
    )
    assert from_env.returncode == 2, from_env.stderr
    assert from_env.stderr.strip().splitlines() == [
        "meshplane: error: VPN name 'a\\nb': 1-32 characters of "
        "A-Z, a-z, 0-9, _ and -, the first a letter or digit"
    ]
