"""The streams side of Message VPNs: one streams service per VPN that a token names.

A VPN's rooms, topics, consumer groups, pub/sub patterns, reader positions and staged writes are its
own service's, over its own data directory: the same topic name in two VPNs is two topics with two
logs, and no request can name, list or count another VPN's objects, because a request only ever
reaches the service of its token's VPN. The default VPN's service keeps the data directory as it
always was (``data_dir``); VPN ``A``'s is ``data_dir/vpns/A`` (:func:`vpn_data_dir`), so a server that
names no VPN keeps its layout, its URLs and its data.

Each VPN's service counts its own topics, partitions, rooms and groups against its own limits: serve's
flags (``--max-topics`` ...), or what the VPN's section of the VPN file sets (``max_topics = 100``,
:func:`VpnEngines.limit`, again at each reload of the file).

Only VPNs some token names get a service (no one else could reach one). On the JetStream backend a
VPN's topics, rooms and groups are streams, buckets and subjects of its own
(:class:`meshplane.streams.jetstream.naming.Naming`); its local files (staged writes, idempotency) are
under its directory as above.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from meshplane.core.mesh.vpn import DEFAULT, check_vpn
from meshplane.streams.config import StreamsConfig
from meshplane.streams.files import default_file_budget
from meshplane.streams.service import StreamsService

VPNS_DIR = "vpns"
_COUNTS = ("max_topics", "max_partitions", "max_rooms", "max_groups")  # a VPN's to set, or serve's


def vpn_data_dir(data_dir: Path, vpn: str) -> Path:
    """Where a VPN's streams live: the data directory itself for the default VPN."""
    return data_dir if vpn == DEFAULT else data_dir / VPNS_DIR / check_vpn(vpn)


def _service_for(default: StreamsService, vpn: str, config: StreamsConfig) -> StreamsService:
    """A VPN's service on the default VPN's storage: its own logs, or its own JetStream names."""
    if default.local_files:
        return StreamsService(config)
    from meshplane.streams.jetstream.service import JetStreamStreamsService

    assert isinstance(default, JetStreamStreamsService)
    store = default.store
    return JetStreamStreamsService(
        config,
        store.servers,
        replicas=store.replicas,
        start_timeout=store.start_timeout,
        progress=store.progress,
        vpn=vpn,
    )


class VpnEngines(Mapping[str, StreamsService]):
    """The streams service of each VPN, by name; ``default`` is always among them."""

    def __init__(
        self,
        default: StreamsService,
        vpns: Collection[str] = (),
        limits: Mapping[str, Mapping[str, int]] | None = None,
    ) -> None:
        others = sorted(set(vpns) - {DEFAULT})
        self._by_name: dict[str, StreamsService] = {DEFAULT: default}
        config = default.config
        self._flags = {key: getattr(config, key) for key in _COUNTS}  # serve's, before any VPN's own
        # The descriptor budget is the process's: shared by the VPNs' logs, not given to each.
        share = max(16, (config.max_open_files or default_file_budget()) // (len(others) + 1))
        if others:
            default.files.capacity = min(default.files.capacity, share)
        for vpn in others:
            made = replace(config, data_dir=vpn_data_dir(Path(config.data_dir), vpn), max_open_files=share)
            self._by_name[vpn] = _service_for(default, vpn, made)
        self.limit(limits or {})

    def limit(self, limits: Mapping[str, Mapping[str, int]]) -> None:
        """Each VPN's limits (``max_topics`` ...: a count limit of ``StreamsConfig``) as the VPN file
        sets them; a VPN or limit it leaves out gets serve's flag's. A lowered limit refuses what
        comes next, and drops nothing."""
        for vpn, engine in self._by_name.items():
            own = limits.get(vpn, {})
            for key, flag in self._flags.items():
                setattr(engine.config, key, own.get(key, flag))

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
