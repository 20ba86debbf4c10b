"""The streams side of Message VPNs: one streams service per VPN that a token names.

A VPN's rooms, topics, consumer groups, pub/sub patterns, reader positions and staged writes are its
own service's, over its own data directory: the same topic name in two VPNs is two topics with two
logs, and no request can name, list or count another VPN's objects, because a request only ever
reaches the service of its token's VPN. The default VPN's service keeps the data directory as it
always was (``data_dir``); VPN ``A``'s is ``data_dir/vpns/A`` (:func:`vpn_data_dir`), so a server that
names no VPN keeps its layout, its URLs and its data.

Only VPNs some token names get a service (no one else could reach one). On the JetStream backend every
server would share one set of streams and buckets, so a VPN beyond the default is refused there.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from meshplane.core.mesh.vpn import DEFAULT, check_vpn
from meshplane.errors import ConfigError
from meshplane.streams.files import default_file_budget
from meshplane.streams.service import StreamsService

VPNS_DIR = "vpns"


def vpn_data_dir(data_dir: Path, vpn: str) -> Path:
    """Where a VPN's streams live: the data directory itself for the default VPN."""
    return data_dir if vpn == DEFAULT else data_dir / VPNS_DIR / check_vpn(vpn)


class VpnEngines(Mapping[str, StreamsService]):
    """The streams service of each VPN, by name; ``default`` is always among them."""

    def __init__(self, default: StreamsService, vpns: Collection[str] = ()) -> None:
        others = sorted(set(vpns) - {DEFAULT})
        if others and not default.local_files:
            raise ConfigError(
                f"tokens of the Message VPN(s) {', '.join(others)}: the streams side keeps VPNs apart "
                "with local storage only (--storage local); JetStream storage serves the default VPN"
            )
        self._by_name: dict[str, StreamsService] = {DEFAULT: default}
        config = default.config
        # The descriptor budget is the process's: shared by the VPNs' logs, not given to each.
        share = max(16, (config.max_open_files or default_file_budget()) // (len(others) + 1))
        if others:
            default.files.capacity = min(default.files.capacity, share)
        for vpn in others:
            made = replace(config, data_dir=vpn_data_dir(Path(config.data_dir), vpn), max_open_files=share)
            self._by_name[vpn] = StreamsService(made)

    def __getitem__(self, vpn: str) -> StreamsService:
        return self._by_name[vpn]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    @property
    def default(self) -> StreamsService:
        return self._by_name[DEFAULT]

    def others(self) -> dict[str, StreamsService]:
        """The services of the VPNs beyond the default."""
        return {vpn: engine for vpn, engine in self._by_name.items() if vpn != DEFAULT}
