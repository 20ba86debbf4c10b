"""One NATS client on a mesh node: its socket (an asyncio protocol) and a :class:`Holder` of the node.

What it publishes becomes the node's event on the same subject (in its VPN); an event that matches
its subscriptions comes to it as MSG (HMSG with headers). A reply subject or headers travel inside
the event (:func:`~meshplane.core.doors.nats_protocol.wrap`); a plain PUB's payload is the event's
body, byte for byte. A publish on a subject some queue holds is a guaranteed event: stored before
the client's next PONG (``flush()``) and its ``+OK`` (verbose), or answered with ``-ERR``.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import Counter
from typing import TYPE_CHECKING

from meshplane.core.doors.nats_groups import InvalidGroup, check_group, marker
from meshplane.core.doors.nats_protocol import (
    OK,
    PING,
    PONG,
    Connect,
    NatsParser,
    NatsProtocolError,
    Op,
    Ping,
    Pong,
    Pub,
    Sub,
    Unsub,
    encode_err,
    encode_info,
    encode_msg,
    status_headers,
    unwrap,
    wrap,
)
from meshplane.core.doors.nats_subs import Subscription, SubscriptionLimit, Subscriptions
from meshplane.core.mesh.frames import FLAG_NATS_ENVELOPE
from meshplane.core.mesh.permissions import Permissions
from meshplane.core.mesh.vpn import DEFAULT, outward, prefix_of
from meshplane.core.subjects import RESERVED, fits, valid_pattern
from meshplane.mesh.holders import MeshEvent
from meshplane.mesh.preauth import bounded

if TYPE_CHECKING:
    from meshplane.mesh.doors.nats import NatsDoor
    from meshplane.mesh.doors.nats_groups import QueueGroup

log = logging.getLogger(__name__)

JETSTREAM = (
    "JetStream is not served by meshplane's NATS door: use meshplane's streams "
    "(the streams server's HTTP/WebSocket API) or its guaranteed queues"
)
OUT_BATCH_BYTES = 256 * 1024  # written at once past this, not at the end of the loop's turn
MAX_PENDING_STORES = 10_000  # guaranteed publishes of one client not yet stored: reading pauses beyond


class NatsClient(asyncio.Protocol):
    def __init__(self, door: NatsDoor, client_id: int) -> None:
        self.door = door
        self.node = door.node
        self.cid = client_id
        self.parser = NatsParser(max_payload=self.node.config.max_payload)
        self.subs = Subscriptions(self.node.config.max_patterns_per_client)
        self.transport: asyncio.Transport | None = None
        self.address = ""
        self.connected = False  # its CONNECT was taken (and its credentials proven)
        self.checking = False  # its CONNECT's password is being checked
        self.verbose = self.pedantic = False
        self.echo = True
        self.headers = self.no_responders = False
        self.name = ""
        self.vpn = DEFAULT
        self.prefix = ""
        self.user = ""
        self.permissions: Permissions | None = None
        self.closed = False
        self.close_reason = ""
        self.pending_stores = 0
        self.waiting_pongs = 0  # PINGs answered once the stores before them are done
        self.pings_out = 0
        self.last_read = time.monotonic()
        self.started = time.monotonic()
        self.msgs_in = self.msgs_out = self.bytes_in = self.bytes_out = 0
        self.groups: dict[str, QueueGroup] = {}  # sid -> the queue group it is a member of
        self.group_delivered: Counter[str] = Counter()  # sid -> events given to it (for UNSUB max)
        self.group_max: dict[str, int] = {}  # sid -> events it still takes (after UNSUB max)
        self.backlog: list[Op] = []  # ops that came with CONNECT while its password is checked
        self.out: list[bytes] = []  # to write at the end of this turn of the loop
        self.out_bytes = 0

    def __hash__(self) -> int:
        return id(self)

    # --- the socket ----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if peer else "?"
        self.door.opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.door.closed(self)
        for sid in list(self.groups):
            self._drop_sid(sid)
        patterns = self.subs.patterns()
        self.node.logins.subscriptions[self.vpn] -= len(patterns)
        for pattern in patterns:
            self.node.unsubscribe(self, pattern)
        self.subs = Subscriptions(0)

    def data_received(self, data: bytes) -> None:
        self.last_read = time.monotonic()
        self.pings_out = 0
        self.bytes_in += len(data)
        try:
            self.parser.read(data, self._operation, self._direct if self.node.direct.enabled else None)
        except NatsProtocolError as exc:
            self.door.counters[f"protocol_{exc.message.lower().replace(' ', '_')}"] += 1
            return self.fail(exc.message, str(exc))

    def _operation(self, op: Op) -> None:
        if self.closed:
            return
        if self.checking:
            self.backlog.append(op)  # bounded: what one read holds (the transport is paused)
        else:
            self.handle(op)

    def _direct(self, buffer: bytearray, start: int) -> int:
        """The direct path takes its PUBs and HPUBs without a reply on subjects it learnt (``publish``)."""
        if not self.connected or self.checking or self.closed or self.verbose or self.permissions is not None:
            return start
        if self.vpn in self.node.logins.rates:  # its VPN's or user's rate is checked per PUB: Python's
            return start
        end, events = self.node.direct.door_read(
            self.prefix, buffer, start, self.parser.max_payload, self.headers
        )
        self.msgs_in += events
        return end

    def send(self, data: bytes) -> None:
        """Queued for one write per turn of the loop (a write per MSG cost a system call each)."""
        if self.transport is None or self.closed:
            return
        if not self.out:
            asyncio.get_running_loop().call_soon(self.write_out)
        self.out.append(data)
        self.out_bytes += len(data)
        if self.out_bytes > OUT_BATCH_BYTES:
            self.write_out()

    def write_out(self) -> None:
        transport, out = self.transport, self.out
        if not out or transport is None or self.closed:
            return
        self.out = []
        self.bytes_out += self.out_bytes
        self.out_bytes = 0
        transport.write(b"".join(out))
        if transport.get_write_buffer_size() > self.door.max_pending:
            self.door.counters["slow_consumers"] += 1
            self.fail("Slow Consumer", f"over {self.door.max_pending} bytes unread")

    def fail(self, message: str, detail: str = "") -> None:
        """-ERR ``message`` and close (nats-server's fatal errors)."""
        if self.closed or self.transport is None:
            return
        self.close_reason = message
        # What waited goes before the error, but to a slow consumer (it is what it cannot take).
        waiting = b"" if message == "Slow Consumer" else b"".join(self.out)
        self.out, self.out_bytes = [], 0
        self.door.quiet.warning(
            message, "closed NATS client %s (%s): %s", self.cid, self.address, bounded(detail or message)
        )
        self.transport.write(waiting + encode_err(message))
        self.closed = True
        self.transport.close()

    def error(self, message: str) -> None:
        """-ERR ``message``; the connection stays."""
        self.door.counters["errors_sent"] += 1
        self.send(encode_err(message))

    def ok(self) -> None:
        if self.verbose:
            self.send(OK)

    # --- operations ----------------------------------------------------------------------------------

    def handle(self, op: Op) -> None:
        if not self.connected:
            if isinstance(op, Connect):
                return self.door.connect(self, op.options)
            return self.fail("Authorization Violation", "an operation before CONNECT")
        if isinstance(op, Pub):
            self.publish(op)
        elif isinstance(op, Sub):
            self.node.direct.forget()  # its routes name sids (a new one may not change the node's interest)
            self.subscribe(op)
        elif isinstance(op, Unsub):
            self.node.direct.forget()
            if op.sid in self.groups and op.max_msgs:
                self.group_max[op.sid] = op.max_msgs - self.group_delivered.get(op.sid, 0)
                if self.group_max[op.sid] <= 0:
                    self._drop_sid(op.sid)
            elif op.sid in self.groups:
                self._drop_sid(op.sid)
            else:
                self._unsubscribe(self.subs.unsub(op.sid, op.max_msgs))
            self.ok()
        elif isinstance(op, Ping):
            if self.pending_stores:
                self.waiting_pongs += 1
            else:
                self.send(PONG)
        elif isinstance(op, Pong):
            pass
        elif isinstance(op, Connect):
            self.fail("Unknown Protocol Operation", "a second CONNECT")
        else:
            self.fail("Unknown Protocol Operation", f"{type(op).__name__.upper()} from a client")

    def accepted(
        self, options: dict[str, object], vpn: str, user: str, permissions: Permissions | None
    ) -> None:
        """Its CONNECT was taken, as ``user`` of ``vpn``: the ops that came after it apply now."""
        self.connected = True
        self.verbose = options.get("verbose") is True
        self.pedantic = options.get("pedantic") is True
        self.echo = options.get("echo", True) is not False
        self.headers = options.get("headers") is True
        self.no_responders = self.headers and options.get("no_responders") is True
        self.name = str(options.get("name", ""))[:64]
        self.vpn, self.prefix, self.user, self.permissions = vpn, prefix_of(vpn), user, permissions
        self.ok()
        backlog, self.backlog = self.backlog, []
        for op in backlog:
            if self.closed:
                return
            self.handle(op)

    def publish(self, op: Pub) -> None:
        subject = op.subject
        self.msgs_in += 1
        if subject.startswith("$JS."):
            self.door.counters["jetstream_refused"] += 1
            return self.error(JETSTREAM)
        if (
            subject.startswith(RESERVED)
            or not self.node.client_subject(subject)
            or not fits(self.prefix + subject)
        ):
            self.door.counters["bad_subjects"] += 1
            return self.error("Invalid Publish Subject") if self.pedantic else None
        if op.reply and (
            op.reply.startswith(RESERVED)
            or not self.node.client_subject(op.reply)
            or not fits(self.prefix + op.reply)
        ):  # the reply is published in its VPN: a service's through an import too
            self.door.counters["bad_subjects"] += 1
            return self.error("Invalid Publish Subject") if self.pedantic else None
        if op.headers is not None and not self.headers:
            return self.fail("Unknown Protocol Operation", "HPUB without headers in CONNECT")
        if self.permissions is not None:
            refused = self.permissions.why_not_publish(subject)
            if refused:
                self.door.node.logins.violations[(self.vpn, self.user)] += 1
                return self.error(f'Permissions Violation for Publish to "{subject[:200]}"')
        limited = (
            self.node.logins.publish_refused(self, len(op.payload))
            if self.vpn in self.node.logins.rates
            else ""
        )
        if limited:
            # Dropped and counted (limits_refused), as nats-server drops what it cannot route: a -ERR
            # closes nats-py's connection, so only a verbose client (waiting for +OK) is told, and one
            # whose PUB was guaranteed (its flush() must not say stored), as for any not stored.
            self.door.counters["rate_refused"] += 1
            if self.door.queue_bound(self.prefix + subject):
                self.door.counters["guaranteed_not_stored"] += 1
                return self.error(f"not stored: {limited[:200]}")
            return self.error(f"Rate Limit Exceeded: {limited[:200]}") if self.verbose else None
        if self.node.imports.services:  # a request to a service its VPN imports goes to the exporter
            copies = self.node.imports.request(self.vpn, subject, op.reply, op.headers, op.payload, self)
            if copies is not None:
                if copies == 0 and op.reply and self.no_responders:
                    self.door.counters["no_responders"] += 1
                    self.reply_status(op.reply, 503)
                return self.ok()
        enveloped = bool(op.reply) or op.headers is not None
        body = wrap(op.reply, op.headers, op.payload) if enveloped else op.payload
        flags = FLAG_NATS_ENVELOPE if enveloped else 0
        skip = None if self.echo else self
        if self.door.queue_bound(self.prefix + subject):
            self.pending_stores += 1
            if self.pending_stores >= MAX_PENDING_STORES and self.transport is not None:
                self.transport.pause_reading()
            task = asyncio.get_running_loop().create_task(
                self.node.publish_guaranteed(self.prefix + subject, body, flags, skip=skip, user=self.user)
            )
            task.add_done_callback(self._stored)
            return
        copies = self.node.publish(subject, body, flags, skip=skip, prefix=self.prefix)
        if not op.reply and self.permissions is None and self.vpn not in self.node.logins.rates:
            # a route the direct path may take next time (a reply is checked and answered here)
            self.node.direct.door_sent(self.prefix, subject)
        if copies == 0 and op.reply and self.no_responders:
            self.door.counters["no_responders"] += 1
            self.reply_status(op.reply, 503)
        self.ok()

    def _stored(self, task: asyncio.Task[None]) -> None:
        self.pending_stores -= 1
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            self.door.counters["guaranteed_not_stored"] += 1
            self.error(f"not stored: {str(exc)[:200]}")
        else:
            self.door.counters["guaranteed_stored"] += 1
            self.ok()
        if self.pending_stores == MAX_PENDING_STORES - 1 and self.transport is not None and not self.closed:
            self.transport.resume_reading()
        if not self.pending_stores:
            while self.waiting_pongs:
                self.waiting_pongs -= 1
                self.send(PONG)

    def reply_status(self, reply: str, code: int) -> None:
        """A status (503: no responders) to this client's own subscriptions on ``reply``."""
        headers = status_headers(code)
        for sub in self.subs.matching(self.prefix + reply):
            self.send(encode_msg(reply, sub.sid, "", b"", headers))
            self._expire(sub)

    def subscribe(self, op: Sub) -> None:
        subject = op.subject
        if op.queue:
            try:
                check_group(op.queue)
            except InvalidGroup as exc:
                return self.error(f"Invalid Queue Group: {exc}")
        if subject.startswith("$JS."):
            return self.error(JETSTREAM)
        if subject.startswith(RESERVED) or valid_pattern(subject) is None or "#" in subject.split("."):
            self.door.counters["bad_subjects"] += 1
            return self.error("Invalid Subject")
        if self.permissions is not None:
            refused = self.permissions.why_not_subscribe(subject)
            if refused:
                self.door.node.logins.violations[(self.vpn, self.user)] += 1
                return self.error(f'Permissions Violation for Subscription to "{subject[:200]}"')
        pattern = self.prefix + subject
        if not fits(marker(op.queue, pattern) if op.queue else pattern):  # with what the mesh adds
            self.door.counters["bad_subjects"] += 1
            return self.error("Invalid Subject")
        if op.sid in self.subs.by_sid or op.sid in self.groups:
            self._drop_sid(op.sid)
        limit = self.node.config.vpns[self.vpn].max_subscriptions
        if limit is not None and self.node.logins.subscriptions[self.vpn] >= limit:
            self.node.logins.limits_refused[(self.vpn, "subscriptions")] += 1
            return self.error(f"Maximum Subscriptions Exceeded: Message VPN {self.vpn!r}: {limit}")
        if len(self.subs) + len(self.groups) >= self.subs.limit:
            self.door.counters["subscription_limit"] += 1
            return self.error(f"Maximum Subscriptions Exceeded: {self.subs.limit} on one connection")
        if op.queue:  # counted as the VPN's subscription too: a group is a holder and an interest
            self.node.logins.subscriptions[self.vpn] += 1
            self.groups[op.sid] = self.door.groups.join(self, op.sid, op.queue, pattern)
            return self.ok()
        try:
            fresh = self.subs.add(op.sid, pattern, op.queue)
        except SubscriptionLimit as exc:
            self.door.counters["subscription_limit"] += 1
            return self.error(f"Maximum Subscriptions Exceeded: {exc}")
        if fresh:
            self.node.logins.subscriptions[self.vpn] += 1
            self.node.subscribe(self, pattern)
        self.ok()

    def _drop_sid(self, sid: str) -> None:
        group = self.groups.pop(sid, None)
        self.group_max.pop(sid, None)
        self.group_delivered.pop(sid, None)
        if group is not None:
            self.node.logins.subscriptions[self.vpn] -= 1
            self.door.groups.leave(self, sid, group)
        else:
            self._unsubscribe(self.subs.remove(sid))

    def _unsubscribe(self, pattern: str | None) -> None:
        """The node's pattern this connection no longer holds (None: it still does)."""
        if pattern is not None:
            self.node.logins.subscriptions[self.vpn] -= 1
            self.node.unsubscribe(self, pattern)

    # --- the node's events ---------------------------------------------------------------------------

    def deliver(self, event: MeshEvent) -> None:
        if self.closed:
            return
        subs = self.subs.matching(event.subject)
        if not subs:
            return
        subject, reply, payload, headers = self._outward(event)
        for sub in subs:
            self.msgs_out += 1
            self.send(encode_msg(subject, sub.sid, reply, payload, headers))
            self._expire(sub)

    def deliver_member(self, sid: str, event: MeshEvent) -> None:
        """An event its queue group chose this member (``sid``) for."""
        if self.closed or sid not in self.groups:
            return
        subject, reply, payload, headers = self._outward(event)
        self.msgs_out += 1
        self.group_delivered[sid] += 1
        self.send(encode_msg(subject, sid, reply, payload, headers))
        if sid in self.group_max:
            self.group_max[sid] -= 1
            if self.group_max[sid] <= 0:
                self._drop_sid(sid)

    def _outward(self, event: MeshEvent) -> tuple[str, str, bytes, bytes | None]:
        """(subject, reply, payload, headers) of an event as this client sees it."""
        reply, headers, payload = "", None, event.body
        if event.flags & FLAG_NATS_ENVELOPE:
            reply, headers, payload = unwrap(event.body)
            if headers is not None and not self.headers:
                headers = None  # a client that cannot read headers gets the payload alone
        return outward(self.prefix, event.subject), reply, payload, headers

    def _expire(self, sub: Subscription) -> None:
        self._unsubscribe(self.subs.expired(sub))

    def hello(self, info: dict[str, object], tls: ssl.SSLContext | None) -> None:
        """INFO; with ``tls``, then TLS from the client's next byte on (as nats-server: INFO in the
        clear, then the client's handshake)."""
        transport = self.transport
        if transport is None:
            return
        transport.write(encode_info(info))
        if tls is not None:
            transport.pause_reading()  # its ClientHello is the TLS layer's, not the parser's
            task = asyncio.get_running_loop().create_task(self._start_tls(transport, tls))
            self.door.tasks.add(task)
            task.add_done_callback(self.door.tasks.discard)

    async def _start_tls(self, transport: asyncio.Transport, tls: ssl.SSLContext) -> None:
        loop = asyncio.get_running_loop()
        try:
            sealed = await loop.start_tls(
                transport,
                self,
                tls,
                server_side=True,
                ssl_handshake_timeout=self.node.config.limits.auth_timeout,
            )
        except (OSError, TimeoutError, ConnectionError) as exc:  # ssl.SSLError is an OSError
            self.door.counters["tls_handshake_failed"] += 1
            self.door.quiet.warning("tls", "NATS client %s: TLS handshake failed: %s", self.address, exc)
            self.closed = True
            transport.close()
            return
        if sealed is None or self.closed:
            transport.close()
            return
        self.transport = sealed

    def tick(self, now: float, ping_interval: float, max_pings_out: int) -> None:
        if now - self.last_read < ping_interval:
            return
        if self.pings_out >= max_pings_out:
            self.door.counters["stale_connections"] += 1
            return self.fail("Stale Connection", f"{self.pings_out} PINGs unanswered")
        self.pings_out += 1
        self.last_read = now
        self.send(PING)

    def status(self) -> dict[str, object]:
        return {
            "cid": self.cid,
            "address": self.address,
            "name": self.name,
            "vpn": self.vpn,
            "user": self.user,
            "subscriptions": len(self.subs) + len(self.groups),
            "msgs_in": self.msgs_in,
            "msgs_out": self.msgs_out,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "pending_bytes": self.transport.get_write_buffer_size() if self.transport else 0,
            "uptime_secs": round(time.monotonic() - self.started, 1),
        }
