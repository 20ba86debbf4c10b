"""Which HA mate is active: a lease in etcd, never an election of our own.

Two keys per node, under ``meshplane/mates/<cluster>/<node>/``:

- ``active``: the active mate's token and route address, bound to its lease (TTL ``ttl``, 3 s by
  default): a paused or cut-off active loses it when etcd expires the lease. Its create revision is
  the **epoch**: every mirror frame carries it, and a standby follows only the epoch it read.
- ``current``: the tokens of the mates that hold every acknowledged write (no lease: it outlives
  the active). The active writes it (only while its ``active`` key is the one it created) before it
  acknowledges anything the set no longer covers: itself alone once its standby drops, both once
  the standby has caught up.

A third, ``alive/<token>``, says a mate runs (active or standby), under a lease of its own: the
operator's ``meshplane mesh mates reset`` (:meth:`MateLease.reset`) deletes ``current`` only while no
mate it names is alive, the way out when every one of them is gone for good.

Both records carry an HMAC keyed by the members' secret (:mod:`meshplane.core.mesh.mate_records`): one
that fails it is ignored and counted (``records_ignored``). An ``active`` key no active mate can have
written (without a lease, or unreadable) is deleted (``records_repaired``): it would never expire.

A mate may take the ``active`` key only while it is free and only if ``current`` names it (or no
mate ever did): a standby that fell behind cannot take over and lose what it missed. The active
stops acknowledging before etcd can expire its lease (it counts the TTL from before each refresh
was sent), so there is never a second writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aetcd

from meshplane.core.mesh.mate_records import (
    Unreadable,
    decode_active,
    decode_current,
    encode_active,
    encode_current,
)
from meshplane.discovery.etcd import _close_quietly, connect_etcd, parse_endpoint
from meshplane.errors import DiscoveryError
from meshplane.streams.errors import StorageError

log = logging.getLogger(__name__)

SAFETY_MARGIN = 0.5  # seconds before etcd could expire the lease that the active stops acknowledging


@dataclass(frozen=True, slots=True)
class ActiveMate:
    token: str
    route: str
    epoch: int


class LeaseLost(StorageError):
    """This mate is no longer known to hold the lease: it must not acknowledge anything."""


class MateLease:
    def __init__(
        self,
        endpoints: tuple[str, ...],
        cluster: str,
        node_id: str,
        token: str,
        *,
        ttl: int = 3,
        credentials: Any = None,
        timeout: float = 2.0,
        secret: str = "",
    ) -> None:
        self._endpoints = [parse_endpoint(e) for e in endpoints]
        self.reset_command = (  # the operator's way out when every mate ``current`` names is gone
            f"meshplane mesh mates reset --etcd {','.join(endpoints)} --cluster {cluster} --node {node_id}"
        )
        self._credentials = credentials
        self.prefix = f"meshplane/mates/{cluster}/{node_id}/"
        self.token = token
        self._secret = secret  # the members': it signs and checks the records
        self.counters: Counter[str] = Counter()
        self.ttl = ttl
        self.timeout = timeout
        self.epoch = 0  # while active: the create revision of our ``active`` key
        self.lost = asyncio.Event()
        self._client: aetcd.Client | None = None
        self._lease: Any = None
        self._valid_until = 0.0
        self._keepalive: asyncio.Task[None] | None = None

    @property
    def _active_key(self) -> bytes:
        return (self.prefix + "active").encode()

    @property
    def _current_key(self) -> bytes:
        return (self.prefix + "current").encode()

    async def _etcd(self) -> aetcd.Client:
        if self._client is None:
            self._client = await connect_etcd(self._endpoints, self._credentials, self.timeout)
        return self._client

    async def _call(self, operation: Any) -> Any:
        """One etcd request within ``timeout``; a failure drops the client (the next one reconnects)."""
        try:
            async with asyncio.timeout(self.timeout):
                return await operation(await self._etcd())
        except (TimeoutError, DiscoveryError, aetcd.exceptions.ClientError, OSError) as exc:
            await self._drop_client()
            raise DiscoveryError(f"etcd: {exc or type(exc).__name__}") from None

    async def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await _close_quietly(client)

    # --- reading -------------------------------------------------------------------------------------

    async def active(self) -> ActiveMate | None:
        """The active mate as etcd has it now, or None (also for a record that fails its check)."""
        found = await self._call(lambda etcd: etcd.get(self._active_key))
        if found is None:
            return None
        try:
            record = decode_active(self._secret, self._active_key, found.value)
        except ValueError as exc:
            self._ignored("active", str(exc))
            if isinstance(exc, Unreadable):
                await self._repair(found, "unreadable")
            return None
        if not found.lease:
            self._ignored("active", "it has no lease, so it would never expire")
            await self._repair(found, "lease-less")
            return None
        return ActiveMate(record.token, record.route, found.create_revision)

    def _ignored(self, name: str, why: str) -> None:
        self.counters["records_ignored"] += 1
        log.warning("HA mate: the %s record in etcd under %s is ignored: %s", name, self.prefix, why[:200])

    async def _repair(self, found: Any, what: str) -> None:
        """Delete an ``active`` key no mate can have written, unless it changed meanwhile."""

        async def delete(etcd: aetcd.Client) -> Any:
            txn = etcd.transactions
            return await etcd.transaction(
                compare=[txn.mod(self._active_key) == found.mod_revision],
                success=[txn.delete(self._active_key)],
                failure=[],
            )

        succeeded, _ = await self._call(delete)
        if succeeded:
            self.counters["records_repaired"] += 1
            log.warning("HA mate: deleted a %s active key under %s", what, self.prefix)

    async def current(self) -> tuple[list[str] | None, int]:
        """The mates known to hold every acknowledged write (None: never written), and its revision;
        a record that fails its check names nobody."""
        found = await self._call(lambda etcd: etcd.get(self._current_key))
        if found is None:
            return None, 0
        try:
            return decode_current(self._secret, self._current_key, found.value), found.mod_revision
        except ValueError as exc:
            self._ignored("current", str(exc))
            return [], found.mod_revision

    # --- the active's lease --------------------------------------------------------------------------

    async def acquire(self) -> bool:
        """Take the ``active`` key if it is free and ``current`` names this mate; True if taken."""
        tokens, revision = await self.current()
        if tokens is not None and self.token not in tokens:
            return False
        lease = await self._call(lambda etcd: etcd.lease(self.ttl))
        sent = time.monotonic()

        async def take(etcd: aetcd.Client) -> Any:
            txn = etcd.transactions
            current_unchanged = (
                txn.version(self._current_key) == 0
                if tokens is None
                else txn.mod(self._current_key) == revision
            )
            return await etcd.transaction(
                compare=[txn.version(self._active_key) == 0, current_unchanged],
                success=[
                    txn.put(
                        self._active_key,
                        encode_active(self._secret, self._active_key, self.token),
                        lease=lease,
                    ),
                    txn.put(self._current_key, encode_current(self._secret, self._current_key, [self.token])),
                ],
                failure=[],
            )

        try:
            succeeded, _ = await self._call(take)
        except DiscoveryError:
            await self._revoke(lease)
            raise
        if not succeeded:
            await self._revoke(lease)
            return False
        found = await self._call(lambda etcd: etcd.get(self._active_key))
        if found is None or found.lease != lease.id:
            return False  # expired at once (a very slow request): try again later
        self._lease, self.epoch = lease, found.create_revision
        self._valid_until = sent + self.ttl - SAFETY_MARGIN
        self.lost.clear()
        self._keepalive = asyncio.create_task(self._keep_alive(), name="meshplane-mate-lease")
        return True

    async def _revoke(self, lease: Any) -> None:
        with contextlib.suppress(DiscoveryError):
            await self._call(lambda etcd: etcd.revoke_lease(lease.id))

    def valid(self) -> bool:
        return not self.lost.is_set() and time.monotonic() < self._valid_until

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless this mate is known to hold the lease now."""
        if not self.valid():
            self._lose("the lease ran out before it was renewed")
            raise LeaseLost(
                f"this HA mate lost its lease (epoch {self.epoch}): it steps down; retry on the other mate"
            )

    def _lose(self, why: str) -> None:
        if not self.lost.is_set():
            log.warning("HA mate: lease of epoch %d lost (%s): stepping down", self.epoch, why)
            self.lost.set()

    async def _keep_alive(self) -> None:
        while not self.lost.is_set():
            await asyncio.sleep(self.ttl / 4)
            sent = time.monotonic()
            try:
                reply = await self._call(lambda etcd: etcd.refresh_lease(self._lease.id))
            except DiscoveryError as exc:
                if time.monotonic() >= self._valid_until:
                    self._lose(str(exc))
                continue
            if reply is None or reply.TTL <= 0:
                self._lose("etcd expired it")
            elif sent < self._valid_until:  # renewed in time: valid a TTL from before the request
                self._valid_until = sent + min(self.ttl, reply.TTL) - SAFETY_MARGIN
            else:
                self._lose("renewed too late to be sure no other mate took over")

    async def publish(self, route: str) -> None:
        """Put this mate's route address in its ``active`` key (the standby dials it there), retrying
        while etcd does not answer and this mate is active."""
        while not self.lost.is_set():
            try:
                await self._while_active(
                    self._active_key, encode_active(self._secret, self._active_key, self.token, route), True
                )
                return
            except DiscoveryError as exc:
                log.warning("HA mate: cannot publish the route address in etcd yet (%s)", exc)
                await asyncio.sleep(0.5)
            except LeaseLost:
                return

    async def set_current(self, tokens: list[str]) -> None:
        """Record who holds every acknowledged write; raises LeaseLost if this mate is not active."""
        await self._while_active(
            self._current_key, encode_current(self._secret, self._current_key, tokens), False
        )

    async def _while_active(self, key: bytes, value: bytes, leased: bool) -> None:
        async def put(etcd: aetcd.Client) -> Any:
            txn = etcd.transactions
            return await etcd.transaction(
                compare=[txn.create(self._active_key) == self.epoch],
                success=[txn.put(key, value, lease=self._lease if leased else None)],
                failure=[],
            )

        succeeded, _ = await self._call(put)
        if not succeeded:
            self._lose("its active key is gone")
            raise LeaseLost(f"this HA mate is no longer active (epoch {self.epoch})")

    async def step_down(self) -> None:
        """Stop renewing and give the lease back (the standby need not wait for it to expire)."""
        if self._lease is not None:
            self._lose("stepping down")
        self.lost.set()
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive
            self._keepalive = None
        if self._lease is not None:
            await self._revoke(self._lease)
            self._lease = None

    async def close(self) -> None:
        await self.step_down()
        await self._drop_client()

    # --- presence, and the operator's view -------------------------------------------------------------

    def _alive_key(self, token: str) -> bytes:
        return f"{self.prefix}alive/{token}".encode()

    async def stay_present(self) -> None:
        """While this mate runs: its ``alive/<token>`` key, under a lease of its own (runs until
        cancelled; etcd drops the key a TTL after the process dies)."""
        while True:
            try:
                await self._present_once()
            except DiscoveryError:
                await asyncio.sleep(0.5)

    async def _present_once(self) -> None:
        lease = await self._call(lambda etcd: etcd.lease(self.ttl))
        await self._call(lambda etcd: etcd.put(self._alive_key(self.token), b"{}", lease=lease))
        while True:
            await asyncio.sleep(self.ttl / 3)
            reply = await self._call(lambda etcd: etcd.refresh_lease(lease.id))
            if reply is None or reply.TTL <= 0:
                return

    async def view(self) -> dict[str, Any]:
        """What etcd holds for this node: the active mate, the epoch, ``current`` and the mates alive."""
        active = await self.active()
        tokens, revision = await self.current()
        found = await self._call(lambda etcd: etcd.get_prefix(self._alive_key("")))
        alive = sorted(kv.key.decode().rsplit("/", 1)[-1] for kv in found)
        return {
            "node": self.prefix.rstrip("/"),
            "active": active.token if active is not None else None,
            "route": active.route if active is not None else None,
            "epoch": active.epoch if active is not None else None,
            "current": tokens,
            "current_revision": revision,
            "alive": alive,
        }

    async def reset(self, revision: int) -> None:
        """Delete ``current`` (as read at ``revision``) while no mate is active: the next mate to start
        takes over with what its own data directory holds. Raises DiscoveryError if etcd changed."""

        async def delete(etcd: aetcd.Client) -> Any:
            txn = etcd.transactions
            return await etcd.transaction(
                compare=[txn.version(self._active_key) == 0, txn.mod(self._current_key) == revision],
                success=[txn.delete(self._current_key)],
                failure=[],
            )

        succeeded, _ = await self._call(delete)
        if not succeeded:
            raise DiscoveryError("etcd changed meanwhile (a mate took the lease, or current was rewritten)")
