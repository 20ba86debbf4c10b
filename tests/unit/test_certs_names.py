"""``meshplane tls``'s names (a reviewer's attack): a name is one path component and one identity
segment, so it can neither write outside the folder nor name a node of another cluster; the folder
it makes for the keys is its owner's alone."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from meshplane import certs
from meshplane.errors import ConfigError


@pytest.mark.parametrize("name", ["../../escaped", "a/b", ".hidden", "", "x" * 65, "é", "a\\b"])
def test_a_name_that_is_not_one_plain_segment_is_refused_before_anything_is_written(
    tmp_path: Path, name: str
) -> None:
    certs.make_ca(tmp_path / "c")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(ConfigError):
        certs.issue(tmp_path / "c", "node", name)
    with pytest.raises(ConfigError):
        certs.issue(tmp_path / "c", "node", "a", cluster=name)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_the_folder_it_makes_for_the_keys_is_the_owners_alone(tmp_path: Path) -> None:
    folder = tmp_path / "made" / "here"
    certs.make_ca(folder)
    assert stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0, oct(folder.stat().st_mode)
