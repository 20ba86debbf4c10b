"""The NATS door of a mesh node (``serve --nats-port``): NATS clients, unchanged, join the mesh.

A listener (loopback unless ``--host`` says otherwise) whose connections are :class:`NatsClient`\\ s,
each a holder on the node like a mesh client. Credentials, in CONNECT:

- where the node's Message VPNs have users: ``user`` and ``pass``, checked as a mesh client's LOGIN
  (argon2, off the loop); the client is then that VPN's, held to that user's permissions. ``user``
  may be ``VPN/NAME`` where two VPNs have a user of that name;
- else, with ``$MESHPLANE_NATS_TOKEN`` set (the environment only, never argv), ``auth_token``;
- else none (loopback by default). A node whose mesh clients must prove a secret refuses to open a
  NATS door that would take anyone.

Limits as nats-server's and the mesh port's: control lines of 4 KB, the node's ``max_payload``, CONNECT
within the auth timeout (unproven connections capped in all and per address), a connection's unread
output bounded (past it: ``-ERR 'Slow Consumer'`` and closed), subscriptions per connection bounded,
PINGs to silent clients (two unanswered: ``Stale Connection``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import os
import ssl
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from meshplane.core.mesh.permissions import Permissions
from meshplane.core.mesh.vpn import DEFAULT
from meshplane.errors import ConfigError
from meshplane.mesh.doors.nats_client import NatsClient
from meshplane.mesh.doors.nats_groups import QueueGroups
from meshplane.mesh.preauth import QuietLog, Unproven, bounded
from meshplane.mesh.queue_items import Queue
from meshplane.mesh.queues import PREFIX
from meshplane.version import __version__

if TYPE_CHECKING:
    from meshplane.mesh.node import MeshNode

log = logging.getLogger(__name__)

TOKEN_ENV = "MESHPLANE_NATS_TOKEN"
PING_INTERVAL = 120.0  # nats-server's ping_interval
MAX_PINGS_OUT = 2
WRONG = "Authorization Violation"
NOBODY = "\x00"  # no user has this name (VPN files refuse control characters)


class NatsDoor:
    def __init__(self, node: MeshNode, port: int) -> None:
        self.node = node
        self.port = port
        self.token = os.environ.get(TOKEN_ENV, "")
        self.clients: dict[int, NatsClient] = {}
        self.counters: Counter[str] = Counter()
        self.quiet = QuietLog(log)
        limits = node.config.limits
        self.unproven: Unproven[NatsClient] = Unproven(
            limits.max_unauthenticated, limits.max_unauthenticated_per_address
        )
        self.max_pending = limits.max_pending_bytes
        self._ids = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._ticker: asyncio.Task[None] | None = None
        self.tasks: set[asyncio.Task[None]] = set()  # password checks and TLS handshakes under way
        # The node's TLS (--mesh-tls-*): NATS clients too, with a certificate its CA signed if it has one.
        self.tls = node.config.tls.server_context() if node.config.tls is not None else None
        self.groups = QueueGroups(node, self.counters)
        self.users = any(vpn.users for vpn in node.config.vpns.values())
        if not self.users and not self.token and node.config.client_secret:
            raise ConfigError(
                f"the NATS door would take anyone while mesh clients prove a secret: set ${TOKEN_ENV} "
                "or give the Message VPNs users"
            )

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._accept, self.node.config.host, self.port, reuse_address=True
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._ticker = asyncio.create_task(self._tick())
        log.info("NATS door on %s:%d", self.node.config.host, self.port)

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        if self._server is not None:
            self._server.close()
        for client in list(self.clients.values()):
            if client.transport is not None:
                client.transport.close()
        if self._server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                async with asyncio.timeout(2):
                    await self._server.wait_closed()

    def _accept(self) -> NatsClient:
        return NatsClient(self, next(self._ids))

    # --- connections ---------------------------------------------------------------------------------

    def opened(self, client: NatsClient) -> None:
        self.counters["connections"] += 1
        if len(self.clients) >= self.node.config.max_clients:
            self.counters["refused_max_clients"] += 1
            return client.fail("maximum connections exceeded")
        refused, oldest = self.unproven.admit(client, client.address)
        if refused:
            self.counters[f"refused_{refused}"] += 1
            return client.fail("Authorization Violation", "too many unauthenticated connections")
        if oldest is not None:
            self.counters["unauthenticated_evicted"] += 1
            oldest.fail("Authentication Timeout", "evicted: too many unauthenticated connections")
        self.clients[client.cid] = client
        client.hello(self.info(client), self.tls)
        loop = asyncio.get_running_loop()
        loop.call_later(self.node.config.limits.auth_timeout, self._deadline, client)

    def info(self, client: NatsClient) -> dict[str, object]:
        return {
            "server_id": f"meshplane-{self.node.node_id}",
            "server_name": self.node.node_id,
            "version": __version__,
            "proto": 1,
            "go": "meshplane",
            "host": self.node.config.host,
            "port": self.port,
            "headers": True,
            "max_payload": self.node.config.max_payload,
            "client_id": client.cid,
            "client_ip": client.address,
            "auth_required": bool(self.users or self.token),
            "cluster": self.node.config.cluster,
            "tls_required": self.tls is not None,
            "tls_verify": self.tls is not None and self.tls.verify_mode == ssl.CERT_REQUIRED,
        }

    def _deadline(self, client: NatsClient) -> None:
        # A CONNECT whose password waits in the node's queue of checks is answered by it (bounded).
        if not client.connected and not client.checking and not client.closed:
            self.counters["auth_timeouts"] += 1
            client.fail("Authentication Timeout")

    def closed(self, client: NatsClient) -> None:
        self.unproven.done(client)
        if self.clients.pop(client.cid, None) is not None and client.connected:
            self.node.logins.connections[client.vpn] -= 1

    def reloaded(self, why_cut: Callable[[str, str], str]) -> int:
        """The node's VPNs were read again: the clients they no longer admit are cut, told why."""
        self.users = any(vpn.users for vpn in self.node.config.vpns.values())
        cut = 0
        for client in [c for c in self.clients.values() if c.connected]:
            reason = why_cut(client.vpn, client.user if client.permissions else "")
            if reason:
                client.fail(WRONG, reason)
                cut += 1
        return cut

    # --- CONNECT -------------------------------------------------------------------------------------

    def connect(self, client: NatsClient, options: dict[str, object]) -> None:
        if options.get("protocol", 0) not in (0, 1) and self._strict(client):
            return
        if self.users:
            user, password = str(options.get("user", "")), str(options.get("pass", ""))
            client.checking = True
            if client.transport is not None:
                client.transport.pause_reading()
            task = asyncio.get_running_loop().create_task(self._check(client, options, user, password))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            return
        if self.token and not hmac.compare_digest(
            str(options.get("auth_token", "")).encode(), self.token.encode()
        ):
            self.counters["auth_refused"] += 1
            return client.fail(WRONG, "a wrong token")
        self._admit(client, options, DEFAULT, "", None)

    def _strict(self, client: NatsClient) -> bool:
        client.fail("Unknown Protocol Operation", "a protocol version this door does not speak")
        return True

    def _user(self, name: str) -> tuple[str, str]:
        """The VPN and user a CONNECT's ``user`` names; an unknown one is (the default VPN, a name no
        user has), checked all the same (so the answer's time tells nothing) and refused."""
        vpn_name, sep, user_name = name.partition("/")
        if sep:
            vpn = self.node.config.vpns.get(vpn_name)
            return (vpn_name, user_name) if vpn is not None and user_name in vpn.users else (DEFAULT, NOBODY)
        found = [vpn.name for vpn in self.node.config.vpns.values() if name in vpn.users]
        return (found[0], name) if len(found) == 1 else (DEFAULT, NOBODY)

    async def _check(self, client: NatsClient, options: dict[str, object], name: str, password: str) -> None:
        # In the node's fair, bounded queue of password checks, with the mesh clients' LOGINs.
        vpn, user_name = self._user(name)
        user, why = await self.node.logins.authenticate(vpn, user_name, password, client.address)
        client.checking = False
        if client.closed:
            return
        if user is None:
            self.counters["auth_refused"] += 1
            log.info("refused a NATS login as %s: %s", bounded(name), why)
            return client.fail(WRONG, why)
        if client.transport is not None:
            client.transport.resume_reading()
        self._admit(client, options, vpn, user.name, user.permissions())

    def _admit(
        self, client: NatsClient, options: dict[str, object], vpn: str, user: str, perms: Permissions | None
    ) -> None:
        full = self.node.logins.connections_full(self.node.config.vpns[vpn])
        if full:
            return client.fail("maximum connections exceeded", full)
        self.unproven.done(client)
        self.node.logins.connections[vpn] += 1
        client.accepted(options, vpn, user, perms)

    # --- routing helpers -----------------------------------------------------------------------------

    def queue_bound(self, subject: str) -> bool:
        """Whether a queue of the mesh (here, on a peer, in another cluster) holds ``subject``: then a
        publish on it is a guaranteed event."""
        guaranteed = self.node.guaranteed
        if not guaranteed.enabled or guaranteed.peers is None or guaranteed.clusters is None:
            return False
        if guaranteed.peers.match(subject) or guaranteed.clusters.match(subject):
            return True
        return any(isinstance(h, Queue) for h in self.node.router.route(PREFIX + subject).local)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(PING_INTERVAL / 4)
            now = time.monotonic()
            for client in list(self.clients.values()):
                if client.connected:
                    client.tick(now, PING_INTERVAL, MAX_PINGS_OUT)

    def metrics(self, prefix: str) -> Iterator[Metric]:
        """``/metrics``: its clients, and its counters by name."""
        yield GaugeMetricFamily(prefix + "nats_clients", "NATS clients on this node", value=len(self.clients))
        counters = CounterMetricFamily(
            prefix + "nats_events", "The NATS door's counters, by name", labels=["counter"]
        )
        for name, count in sorted(self.counters.items()):
            counters.add_metric([name], count)
        yield counters

    # --- what it looks like --------------------------------------------------------------------------

    def status(self, limit: int = 1000) -> dict[str, Any]:
        return {
            "port": self.port,
            "auth": "users" if self.users else "token" if self.token else "none",
            "clients": [c.status() for c in itertools.islice(self.clients.values(), limit)],
            "counters": dict(self.counters),
            "queue_groups": self.groups.status(),
        }
