"""etcd discovery through aetcd: one lease per object, kept alive, re-created after an etcd restart."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aetcd
import aetcd.rpc
import grpc

from meshplane.aio import wait_at_most
from meshplane.core.snapshots import Added, DiscoveryEvent, Removed, diff_snapshot
from meshplane.discovery.base import Discovery
from meshplane.errors import ConfigError, DiscoveryError

log = logging.getLogger(__name__)
_MAX_BACKOFF = 2.0


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``http://host:port``, ``host:port`` or ``host`` -> (host, port)."""
    url = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ConfigError(f"ETCD_ENDPOINTS entry {endpoint!r} is not host:port or http://host:port")
    try:
        return url.hostname, url.port or 2379
    except ValueError as exc:
        raise ConfigError(f"ETCD_ENDPOINTS entry {endpoint!r}: {exc}") from None


async def _close_quietly(client: aetcd.Client, timeout: float = 2.0) -> None:
    """Close a client without hanging: grpc.aio can stall closing a channel whose watch stream is still
    being set up. Past ``timeout`` the close goes on in the background and we move on."""
    await wait_at_most(client.close(), timeout)


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """PEM files for TLS to etcd: the CA of its certificate, and a client certificate and key for
    an etcd that verifies clients (--client-cert-auth)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: Path | None) -> bytes | None:
            try:
                return path.read_bytes() if path is not None else None
            except OSError as exc:
                raise ConfigError(f"cannot read the etcd TLS file {path}: {exc.strerror}") from None

        return grpc.ssl_channel_credentials(read(self.ca), read(self.key), read(self.cert))


class _TlsClient(aetcd.Client):  # type: ignore[misc]  # aetcd has no type information
    """aetcd 1.0 opens only plaintext channels (``rpc.insecure_channel``); this client gives its
    connect a TLS channel instead. The swap is made under a lock every connect of ours takes, so no
    plaintext connect in this process can see it."""

    def __init__(self, credentials: grpc.ChannelCredentials, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._credentials = credentials

    async def connect(self) -> None:
        plaintext = aetcd.rpc.insecure_channel
        secure = functools.partial(aetcd.rpc.secure_channel, credentials=self._credentials)
        aetcd.rpc.insecure_channel = secure
        try:
            await super().connect()
        finally:
            aetcd.rpc.insecure_channel = plaintext


_CONNECTS = asyncio.Lock()


async def connect_etcd(
    endpoints: list[tuple[str, int]], credentials: grpc.ChannelCredentials | None, timeout: float
) -> aetcd.Client:
    """A client of the first endpoint that answers (TLS with ``credentials``)."""
    errors = []
    for host, port in endpoints:
        client = (
            aetcd.Client(host=host, port=port, timeout=timeout)
            if credentials is None
            else _TlsClient(credentials, host=host, port=port, timeout=timeout)
        )
        try:
            async with _CONNECTS:
                await client.connect()
            await client.status()  # gRPC connects lazily; make sure someone answers
            return client
        except Exception as exc:
            errors.append(f"{host}:{port}: {exc}")
            await _close_quietly(client)
    raise DiscoveryError("cannot reach etcd (" + "; ".join(errors) + "); is etcd running? see ETCD_ENDPOINTS")


class EtcdDiscovery(Discovery):
    name = "etcd"

    def __init__(
        self,
        endpoints: tuple[str, ...],
        lease_ttl: int = 10,
        connect_timeout: float = 5.0,
        tls: EtcdTls | None = None,
    ) -> None:
        self._endpoints = [parse_endpoint(e) for e in endpoints]
        # https:// endpoints, or TLS files, mean TLS (with the system's CAs when no CA is given).
        use_tls = tls is not None or any(e.startswith("https://") for e in endpoints)
        self._credentials = (tls or EtcdTls()).credentials() if use_tls else None
        self._lease_ttl = lease_ttl
        self._connect_timeout = connect_timeout
        self._client: aetcd.Client | None = None
        self._lease: Any = None
        self._owned: dict[str, bytes] = {}
        self._keepalive: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def _connect(self) -> aetcd.Client:
        return await connect_etcd(self._endpoints, self._credentials, self._connect_timeout)

    async def _ensure_client(self) -> aetcd.Client:
        if self._client is None:
            self._client = await self._connect()
        return self._client

    async def start(self) -> None:
        await self._ensure_client()

    async def _ensure_lease(self) -> Any:
        client = await self._ensure_client()
        if self._lease is None:
            self._lease = await client.lease(self._lease_ttl)
            if self._keepalive is None or self._keepalive.done():
                self._keepalive = asyncio.create_task(self._keep_alive(), name="meshplane-etcd-keepalive")
        return self._lease

    async def register(self, key: str, value: bytes) -> None:
        async with self._lock:
            try:
                lease = await self._ensure_lease()
                await self._client.put(key.encode(), value, lease=lease)  # type: ignore[union-attr]
            except DiscoveryError:
                raise
            except Exception as exc:
                raise DiscoveryError(f"cannot register {key} in etcd: {exc}") from exc
            self._owned[key] = value

    async def unregister(self, key: str) -> None:
        async with self._lock:
            self._owned.pop(key, None)
            if self._client is not None:
                try:
                    await self._client.delete(key.encode())
                except Exception as exc:  # the lease takes it away anyway
                    log.warning("cannot delete %s from etcd (it expires with the lease): %s", key, exc)

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self._lease_ttl / 3)
            try:
                reply = await self._lease.refresh()
                if reply is not None and reply.TTL > 0:
                    continue
                log.warning(
                    "etcd lease %x expired; registering %d keys again", self._lease.id, len(self._owned)
                )
            except Exception as exc:
                log.warning("etcd keep-alive failed (%s); reconnecting", exc)
            await self._recover()

    async def _recover(self) -> None:
        backoff = 0.1
        while True:
            async with self._lock:
                try:
                    if self._client is not None:
                        await _close_quietly(self._client)
                    self._client = None
                    self._lease = None
                    client = await self._ensure_client()
                    self._lease = await client.lease(self._lease_ttl)
                    for key, value in self._owned.items():
                        await client.put(key.encode(), value, lease=self._lease)
                    log.info("etcd lease re-created; %d keys registered again", len(self._owned))
                    return
                except Exception as exc:
                    log.warning("etcd still unreachable (%s); retrying in %.1fs", exc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF)

    async def _snapshot(self, client: aetcd.Client, prefix: str) -> tuple[dict[str, bytes], int]:
        result = await client.get_prefix(prefix.encode())
        return {kv.key.decode(): kv.value for kv in result}, result.header.revision

    async def list(self, prefix: str) -> dict[str, bytes]:
        try:
            return (await self._snapshot(await self._ensure_client(), prefix))[0]
        except DiscoveryError:
            raise
        except Exception as exc:
            raise DiscoveryError(f"cannot list {prefix} in etcd: {exc}") from exc

    async def list_and_watch(self, prefix: str) -> AsyncIterator[DiscoveryEvent]:
        known: dict[str, bytes] = {}
        backoff = 0.1
        while True:
            # A separate client per watch: a broken stream must not take the lease's client with it.
            client: aetcd.Client | None = None
            try:
                client = await self._connect()
                snapshot, revision = await self._snapshot(client, prefix)
                for event in diff_snapshot(known, snapshot):
                    yield event
                backoff = 0.1
                watch = await client.watch_prefix(prefix.encode(), start_revision=revision + 1)
                async for change in watch:
                    key = change.kv.key.decode()
                    if change.kind == "PUT":
                        if known.get(key) != change.kv.value:
                            known[key] = change.kv.value
                            yield Added(key, change.kv.value)
                    elif known.pop(key, None) is not None:
                        yield Removed(key)
                raise DiscoveryError("etcd watch stream ended")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("etcd watch on %s interrupted (%s); resyncing in %.1fs", prefix, exc, backoff)
            finally:
                if client is not None:
                    await _close_quietly(client)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF)

    async def close(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive
        if self._client is not None:
            if self._lease is not None:
                try:
                    await self._lease.revoke()  # takes every key of ours away at once
                except Exception as exc:
                    log.warning("cannot revoke etcd lease (keys expire in %ss): %s", self._lease_ttl, exc)
            await _close_quietly(self._client)
        self._client = None
        self._lease = None
        self._owned.clear()

    @property
    def registered(self) -> int:
        return len(self._owned)
