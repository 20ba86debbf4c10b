"""A node's Message VPNs, read from ``--mesh-vpns FILE`` (TOML):

```toml
[vpns.team-a]          # a VPN; "default" always exists
[vpns.team-b]
```

Every node of a mesh is given the same file. A client names its VPN in its HELLO (``MeshClient(...,
vpn="team-a")``); a node refuses a VPN it does not have. See :mod:`meshplane.core.mesh.vpn` for how
VPNs are kept apart.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from meshplane.core.mesh.vpn import DEFAULT, check_vpn
from meshplane.errors import ConfigError


@dataclass(frozen=True)
class Vpn:
    name: str


@dataclass(frozen=True)
class Vpns(Mapping[str, Vpn]):
    """The VPNs of a node, by name; ``default`` among them."""

    by_name: dict[str, Vpn] = field(default_factory=lambda: {DEFAULT: Vpn(DEFAULT)})

    def __getitem__(self, name: str) -> Vpn:
        return self.by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.by_name)

    def __len__(self) -> int:
        return len(self.by_name)


def parse_vpns(text: str, where: str = "the VPN file") -> Vpns:
    """The VPNs a TOML text declares; ConfigError naming the first mistake."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not TOML: {exc}") from None
    unknown = set(document) - {"vpns"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}: only [vpns.NAME] sections")
    declared = document.get("vpns", {})
    if not isinstance(declared, dict):
        raise ConfigError(f"{where}: 'vpns' must be a table of [vpns.NAME] sections")
    by_name = {DEFAULT: Vpn(DEFAULT)}
    for name, settings in declared.items():
        try:
            check_vpn(name)
        except ValueError as exc:
            raise ConfigError(f"{where}: [vpns.{name}]: {exc}") from None
        if not isinstance(settings, dict):
            raise ConfigError(f"{where}: vpns.{name} must be a section ([vpns.{name}])")
        by_name[name] = Vpn(name)
    return Vpns(by_name)


def load_vpns(path: Path) -> Vpns:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"--mesh-vpns {path}: cannot read it ({exc.strerror or exc})") from None
    return parse_vpns(text, str(path))
