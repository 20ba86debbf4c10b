"""Discovery backends (etcd, file, mem) behind one interface, and EventChannel watching."""

from __future__ import annotations

from meshplane.config import PlaneConfig
from meshplane.discovery.base import Discovery


def create_discovery(config: PlaneConfig) -> Discovery:
    """The backend ``config.discovery_backend`` names (not started yet)."""
    if config.discovery_backend == "mem":
        from meshplane.discovery.mem import MemoryDiscovery

        return MemoryDiscovery()
    if config.discovery_backend == "file":
        from meshplane.discovery.file import FileDiscovery

        return FileDiscovery(config.file_kv, config.file_kv_ttl, config.file_kv_poll_interval)
    from meshplane.discovery.etcd import EtcdDiscovery

    tls = None
    if config.etcd_tls_ca or config.etcd_tls_cert:
        from meshplane.discovery.etcd import EtcdTls

        tls = EtcdTls(config.etcd_tls_ca, config.etcd_tls_cert, config.etcd_tls_key)
    return EtcdDiscovery(config.etcd_endpoints, config.etcd_lease_ttl, config.connect_timeout, tls)


__all__ = ["Discovery", "create_discovery"]
