"""One event per input line of `meshplane topic produce`. Pure."""

from __future__ import annotations

import pytest

from meshplane.cli.errors import CliError
from meshplane.cli.produce import parse_line


def test_lines_become_events() -> None:
    assert parse_line('{"a": 1}', 1, None, False) == {"data": {"a": 1}}
    assert parse_line("plain words", 1, None, False) == {"data": "plain words"}
    assert parse_line("k:v:w", 1, ":", False) == {"key": "k", "data": "v:w"}  # the first delimiter splits
    assert parse_line("k:[1, 2]", 1, ":", False) == {"key": "k", "data": [1, 2]}
    assert parse_line('{"a": 1}', 1, None, True) == {"data": '{"a": 1}'}  # --text


def test_bad_lines_are_named() -> None:
    with pytest.raises(CliError, match="line 3 has no key delimiter"):
        parse_line("no key", 3, ":", False)
    with pytest.raises(CliError, match="line 4 is not valid JSON"):
        parse_line("{broken", 4, None, False)
