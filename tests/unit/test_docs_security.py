"""docs/security.md's table of mesh limits says what the flags do (issue 54: it said 1024 routes where
the code had 256): every limit flag has a row, and each row's default is the flag's."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from meshplane.cli.mesh import PEER_LIMIT_FLAGS, add_mesh_options

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
UNITS = {"": 1, "s": 1, "KB": 1024, "KiB": 1024, "MiB": 1 << 20}


def documented_defaults() -> dict[str, float]:
    """``--mesh-...`` flag -> the default its row states."""
    section = DOC.read_text().split("### Limits per connection", 1)[1]
    rows = re.findall(r"^\| `(--mesh-[a-z-]+)`[^|]*\| ([^|]+) \|", section, re.MULTILINE)
    defaults = {}
    for flag, default in rows:
        match = re.fullmatch(r"([\d,.]+) ?(s|KB|KiB|MiB)?", default.strip())
        assert match, f"{flag}: cannot read the default {default!r}"
        defaults[flag] = float(match[1].replace(",", "")) * UNITS[match[2] or ""]
    return defaults


def test_every_mesh_limit_flag_has_a_row_with_its_default() -> None:
    parser = argparse.ArgumentParser()
    add_mesh_options(parser)
    defaults = vars(parser.parse_args([]))
    documented = documented_defaults()
    flags = {f"--mesh-{name.replace('_', '-')}": defaults[f"mesh_{name}"] for name in PEER_LIMIT_FLAGS}
    assert set(documented) == set(flags)
    for flag, default in flags.items():
        assert documented[flag] == default, f"{flag}: the docs say {documented[flag]}, the flag {default}"
