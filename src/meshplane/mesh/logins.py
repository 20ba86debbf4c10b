"""A node's clients by Message VPN: logging in as a VPN's users, what their permissions refuse, and
the VPN's and its users' limits on this node.

A client of a VPN with users sends LOGIN (its user and password) as the first frame of its sealed
session; the node takes nothing else from it before. The password is checked against the user's
argon2 hash off the event loop, two at a time at most (each check holds ~64 MiB for ~50 ms), the
waiting ones shared fairly by source address and user name (:mod:`meshplane.core.mesh.login_checks`:
a flood of wrong passwords from one address cannot keep another address's users waiting behind it; a
LOGIN past its address's or the node's queue is refused at once, said and counted as ``logins_busy``).
A wrong user or password is answered with one reason for both, in the same time (no user names are
learnt from it), and the connection closed. A client that has not sent LOGIN within the auth timeout
is closed; one that has waits for its check (the queue bounds how long), so others' checks do not
count against its deadline. Passwords are never logged or kept beyond their check.

A refused publish or subscription is answered with REFUSED (the subject or pattern, and why) and
counted per VPN and user (``GET /mesh``'s ``vpns``); the connection stays up. Limits (a VPN's
``max_connections``, ``max_subscriptions``, publish rates; a user's likewise) refuse what passes them
with the reason, counted in ``limits_refused``; a publish past a rate is told at most once a second.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import ssl
import time
from collections import Counter
from typing import TYPE_CHECKING, Protocol

from meshplane.core.mesh.frames import Frame, FrameType, decode_login, encode_frame
from meshplane.core.mesh.identity import certificate_names
from meshplane.core.mesh.login_checks import LOGIN_FIRST, WRONG, CheckLimits, LoginChecks
from meshplane.core.mesh.rate import TokenBucket
from meshplane.mesh.holders import ClientSession
from meshplane.mesh.preauth import bounded
from meshplane.mesh.vpn_reload import VpnReloads
from meshplane.mesh.vpns import LIMITS, STREAMS_LIMITS, USER_LIMITS, User, Vpn, hash_password

if TYPE_CHECKING:
    from meshplane.mesh.node import MeshNode

log = logging.getLogger(__name__)


class Publisher(Protocol):
    """Whose publishes a VPN's rates count: a mesh client, a door's client."""

    @property
    def vpn(self) -> str: ...

    @property
    def user(self) -> str: ...


Buckets = tuple[TokenBucket | None, TokenBucket | None]  # (events, bytes) per second on this node

CHECKS_AT_ONCE = 2  # each holds ~64 MiB: a node spends at most 128 MiB on them


class Logins:
    def __init__(self, node: MeshNode) -> None:
        self.node = node
        # the LOGINs (by session) and other doors' checks (by a token of their own) waiting or running
        self.checks: LoginChecks[object] = LoginChecks(CheckLimits(slots=CHECKS_AT_ONCE))
        self._doors: dict[object, tuple[str, str, str, asyncio.Future[User | None]]] = {}
        self._logins: dict[ClientSession, tuple[str, str]] = {}  # (user, password) waiting for a check
        self.refused: Counter[str] = Counter()  # by VPN: logins refused
        self.busy: Counter[str] = Counter()  # by VPN: logins refused unchecked (the checks' queue was full)
        self.violations: Counter[tuple[str, str]] = Counter()  # by (VPN, user): what permissions refused
        self._tasks: set[asyncio.Task[None]] = set()  # the checks under way
        self.subscriptions: Counter[str] = Counter()  # by VPN: patterns its clients hold here
        self.connections: Counter[str] = Counter()  # by VPN: its clients here
        self.limits_refused: Counter[tuple[str, str]] = Counter()  # by (VPN, limit)
        self._nobody: User | None = None  # checked for a user name no VPN has
        self.reloads = VpnReloads(node, node.config.vpns_file)
        self.user_connections: Counter[tuple[str, str]] = Counter()  # by (VPN, user): its clients here
        self.user_subscriptions: Counter[tuple[str, str]] = Counter()  # by (VPN, user): their patterns here
        # by VPN with a publish limit: (events, bytes) per second on this node
        self.rates: dict[str, Buckets] = {}
        self.user_rates: dict[tuple[str, str], Buckets] = {}  # by (VPN, user) with a publish limit
        self._rate_said: dict[ClientSession, float] = {}  # when a client was last told of a rate
        self.configured()

    def configured(self) -> None:
        """The node's VPNs are new (started, reloaded): their publish limits start afresh. A VPN is
        in ``rates`` when it or one of its users has one (its clients' publishes are then checked)."""
        vpns = self.node.config.vpns.values()
        self.user_rates = {
            (vpn.name, user.name): _buckets(user.max_events_per_second, user.max_bytes_per_second)
            for vpn in vpns
            for user in vpn.users.values()
            if user.max_events_per_second or user.max_bytes_per_second
        }
        self.rates = {
            vpn.name: _buckets(vpn.max_events_per_second, vpn.max_bytes_per_second)
            for vpn in vpns
            if vpn.max_events_per_second
            or vpn.max_bytes_per_second
            or any(v == vpn.name for v, _ in self.user_rates)
        }

    def publish_refused(self, session: Publisher, size: int) -> str:
        """Why ``session``'s (a mesh client's, a door's client's) publish of ``size`` bytes passes its
        VPN's or its user's rate on this node (refused, counted), or "" (it is counted against both)."""
        now = time.monotonic()
        vpn = self.rates[session.vpn]
        whose, (limit, rate) = f"Message VPN {session.vpn!r}", _take(vpn, size, now)
        mine = self.user_rates.get((session.vpn, session.user)) if session.user else None
        if not limit and mine is not None:
            whose, (limit, rate) = f"user {session.user!r}", _take(mine, size, now)
            if limit:
                _give_back(vpn, size)
                limit = "user_" + limit
        if not limit:
            return ""
        self.limits_refused[(session.vpn, limit)] += 1
        what = "events" if limit.endswith("events_per_second") else "bytes"
        return f"{whose}: {rate:g} {what} a second on this node (its limit): not published"

    def tell_rate(self, session: ClientSession, subject: str, sequence: int, reason: str) -> None:
        """A publish past its VPN's rate, said to the client once a second at most (each is counted):
        a client that floods is not answered with a flood."""
        now = time.monotonic()
        if now - self._rate_said.get(session, -1.0) >= 1.0:
            self._rate_said[session] = now
            self.violation(session, subject, sequence, reason, counted=False)

    def connections_full(self, vpn: Vpn) -> str:
        """Why ``vpn`` takes no more clients on this node (its limit: the new one is refused, counted),
        or ""."""
        limit = vpn.max_connections
        if limit is None or self.connections[vpn.name] < limit:
            return ""
        self.limits_refused[(vpn.name, "connections")] += 1
        return f"Message VPN {vpn.name!r}: {limit} clients (its limit)"

    def subscription_refused(self, session: ClientSession) -> str:
        """Why ``session`` may not hold one more pattern (its VPN's or its user's limit on this node),
        or ""."""
        vpn = self.node.config.vpns[session.vpn]
        limit = vpn.max_subscriptions
        if limit is not None and self.subscriptions[session.vpn] >= limit:
            self.limits_refused[(session.vpn, "subscriptions")] += 1
            return f"Message VPN {session.vpn!r}: {limit} subscriptions on this node (its limit)"
        user = vpn.users.get(session.user) if session.user and not session.login_pending else None
        limit = user.max_subscriptions if user is not None else None
        if limit is not None and self.user_subscriptions[(session.vpn, session.user)] >= limit:
            self.limits_refused[(session.vpn, "user_subscriptions")] += 1
            return f"user {session.user!r}: {limit} subscriptions on this node (its limit)"
        return ""

    def subscribed(self, session: ClientSession, patterns: int) -> None:
        """``session`` holds ``patterns`` more (or, below 0, fewer) patterns than before."""
        self.subscriptions[session.vpn] += patterns
        if session.user and not session.login_pending:
            self.user_subscriptions[(session.vpn, session.user)] += patterns

    def joined(self, session: ClientSession) -> None:
        """A new client: counted in its VPN; if the VPN has users, it logs in first, within the auth
        timeout, and is counted once it has (a client that cannot log in takes none of its users'
        connections)."""
        vpn = self.node.config.vpns[session.vpn]
        if not vpn.users:
            self.connections[session.vpn] += 1
            return
        session.login_pending = True
        users = vpn.by_certificate(self._certificate_names(session))
        if len(users) == 1:  # its verified client certificate names one of the VPN's users
            session.user = users[0].name
            self._admit(session, vpn, users[0], answer=False)
            return
        loop = asyncio.get_running_loop()
        loop.call_later(self.node.config.limits.auth_timeout, self._deadline, session)

    def _certificate_names(self, session: ClientSession) -> set[str]:
        """The names of the client's certificate, if the node verified it (``--mesh-tls-ca``)."""
        tls = self.node.config.tls
        transport = session.conn.transport
        if tls is None or tls.ca is None or transport is None:
            return set()
        ssl_object = transport.get_extra_info("ssl_object")
        return certificate_names(ssl_object.getpeercert() if isinstance(ssl_object, ssl.SSLObject) else None)

    def _login_first(self, session: ClientSession) -> str:
        vpn = self.node.config.vpns.get(session.vpn)
        if vpn is None or not any(user.certificate for user in vpn.users.values()):
            return f"{LOGIN_FIRST}: this Message VPN has users"
        # A certificate naming two users proves neither: which one is not the file's order to say.
        named = sorted(user.name for user in vpn.by_certificate(self._certificate_names(session)))
        whom = f"more than one of them: {', '.join(named)}" if named else "none of them"
        return f"{LOGIN_FIRST}: this Message VPN has users, and the client's certificate names {whom}"

    def left(self, session: ClientSession, patterns: int) -> None:
        if self._logins.pop(session, None) is not None:  # gone while waiting: no check to spend
            self.checks.cancel(session)
        self._rate_said.pop(session, None)
        if not session.login_pending:
            self.connections[session.vpn] -= 1
            if session.user:
                self.user_connections[(session.vpn, session.user)] -= 1
        self.subscribed(session, -patterns)

    def _deadline(self, session: ClientSession) -> None:
        # A client whose LOGIN arrived (its user is set) waits for its check instead: the time other
        # clients' checks take is not its own, and the checks' queue bounds that wait.
        if session.login_pending and not session.user and session.conn.is_open:
            self.node.frame_errors["login_timeout"] += 1
            self._refuse(session, self._login_first(session))

    def on_frame(self, session: ClientSession, frame: Frame) -> None:
        """A frame from a client that has not logged in yet: LOGIN, once."""
        if frame.type is FrameType.HEARTBEAT:
            return
        if frame.type is not FrameType.LOGIN or session.user:
            self.node.frame_errors["before_login"] += 1
            self._refuse(session, self._login_first(session))
            return
        try:
            login = decode_login(frame.payload)
        except ValueError:
            self._refuse(session, "a malformed LOGIN")
            return
        session.user = login.user[:64] or "?"  # taken: a second LOGIN is refused, not checked again
        busy = self.checks.offer(session, _address(session), session.user)
        if busy:
            self.busy[session.vpn] += 1
            log.debug("refused a login to Message VPN %s unchecked: %s", session.vpn, busy)  # counted
            return self._refuse(session, busy)
        self._logins[session] = (login.user, login.password)
        self._start_checks()

    async def authenticate(self, vpn: str, name: str, password: str, address: str) -> tuple[User | None, str]:
        """For another door to a VPN (a NATS or MQTT listener): check ``name``'s password in the same
        fair, bounded queue as the mesh's LOGINs (so it shares their memory bound and cannot starve
        them, nor be starved). (the user, "") or (None, why: a wrong user or password, or the queue
        full); refusals counted in the VPN's ``logins_refused``. Limits on connections are the
        caller's (:meth:`connections_full`)."""
        token = object()
        busy = self.checks.offer(token, address, name[:64] or "?")
        if busy:
            self.busy[vpn] += 1
            self.refused[vpn] += 1
            return None, busy
        answer: asyncio.Future[User | None] = asyncio.get_running_loop().create_future()
        self._doors[token] = (vpn, name, password, answer)
        try:
            self._start_checks()
            user = await answer
        finally:
            if self._doors.pop(token, None) is not None:  # the caller gave up while it waited
                self.checks.cancel(token)
                self._start_checks()
        if user is None:
            self.refused[vpn] += 1
            return None, WRONG
        return user, ""

    def _start_checks(self) -> None:
        for who in self.checks.start():
            check = self._check(who) if isinstance(who, ClientSession) else self._door_check(who)
            task = asyncio.get_running_loop().create_task(check)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _door_check(self, token: object) -> None:
        vpn, name, password, answer = self._doors.pop(token)
        try:
            ok, user = await self._password_ok(vpn, name, password)
        finally:
            self.checks.done(token)
            self._start_checks()
        if not answer.done():
            answer.set_result(user if ok else None)

    async def _check(self, session: ClientSession) -> None:
        try:
            ok, user = await self._password_ok(session.vpn, *self._logins.pop(session))
        finally:
            self.checks.done(session)
            self._start_checks()
        if not session.conn.is_open:
            return
        vpn = self.node.config.vpns.get(session.vpn)
        if user is not None and (vpn is None or vpn.users.get(user.name) != user):
            return self._refuse(session, "the Message VPN's users were reloaded meanwhile: log in again")
        if user is None or not ok:
            log.info("refused a login to Message VPN %s as %s: %s", session.vpn, bounded(session.user), WRONG)
            return self._refuse(session, WRONG)
        assert vpn is not None
        self._admit(session, vpn, user)

    def _admit(self, session: ClientSession, vpn: Vpn, user: User, answer: bool = True) -> None:
        """``session`` proved it is ``user``: logged in, within the VPN's and the user's limits."""
        full = self.connections_full(vpn)  # others logged in meanwhile
        if full:
            return self._refuse(session, full, counted=False, said=not answer)
        mine = (session.vpn, user.name)
        if user.max_connections is not None and self.user_connections[mine] >= user.max_connections:
            self.limits_refused[(session.vpn, "user_connections")] += 1
            why = f"user {user.name!r}: {user.max_connections} clients on this node (its limit)"
            return self._refuse(session, why, counted=False, said=not answer)
        self.user_connections[mine] += 1
        self.connections[session.vpn] += 1
        session.permissions = user.permissions()
        session.login_pending = False
        if answer:
            session.conn.send(encode_frame(FrameType.LOGIN, self.node.node_id))

    async def _password_ok(self, vpn_name: str, name: str, password: str) -> tuple[bool, User | None]:
        vpn = self.node.config.vpns.get(vpn_name)  # None: reloaded away while the check waited
        user = vpn.users.get(name) if vpn is not None else None
        if self._nobody is None:  # made once, off the loop (hashing is as slow as checking)
            self._nobody = User("", await asyncio.to_thread(hash_password, secrets.token_hex(16)))
        # An unknown user (or one that logs in by certificate only) is checked too, against a password
        # nobody has: refused in the same time as a wrong password, so the time tells no user names.
        checked = user if user is not None and user.password_hash else self._nobody
        return await asyncio.to_thread(checked.password_ok, password) and checked is user, user

    def _refuse(
        self, session: ClientSession, reason: str, counted: bool = True, said: bool | None = None
    ) -> None:
        """Refused, closed. ``said``: told with REFUSED too, as a client that sent no LOGIN awaits no
        answer to one (None: when the client has sent none)."""
        if counted:
            self.refused[session.vpn] += 1
        if session.conn.is_open:
            session.conn.send(encode_frame(FrameType.LOGIN, self.node.node_id, payload=reason.encode()))
            if not session.user if said is None else said:
                session.conn.send(encode_frame(FrameType.REFUSED, self.node.node_id, "", 0, reason.encode()))
            session.conn.close()

    def violation(
        self, session: ClientSession, subject: str, sequence: int, reason: str, counted: bool = True
    ) -> None:
        """Refused, said to the client, counted (``counted``: as the user's violation); never applied."""
        if counted:
            self.violations[(session.vpn, session.user)] += 1
        if session.conn.is_open:
            refusal = encode_frame(FrameType.REFUSED, self.node.node_id, subject, sequence, reason.encode())
            session.conn.send(refusal)

    def status(self) -> dict[str, dict[str, object]]:
        """Per VPN: its clients, users, refused logins, limits (each user's too; None: not set) and each
        user's violations."""
        return {
            name: {
                "clients": self.connections[name],
                "users": sorted(vpn.users),
                "subscriptions": self.subscriptions[name],
                "spool_bytes": self.node.guaranteed.vpn_room.spooled_bytes(name),
                "users_spool_bytes": {
                    u: self.node.guaranteed.vpn_room.user_bytes(name, u) for u in sorted(vpn.users)
                },
                "logins_refused": self.refused[name],
                "logins_busy": self.busy[name],
                "limits": {key: getattr(vpn, key) for key in (*LIMITS, *STREAMS_LIMITS)},
                "user_limits": {
                    u: {key: getattr(user, key) for key in USER_LIMITS}
                    for u, user in sorted(vpn.users.items())
                },
                "limits_refused": {
                    what: n for (v, what), n in sorted(self.limits_refused.items()) if v == name
                },
                "violations": {user: n for (v, user), n in sorted(self.violations.items()) if v == name},
            }
            for name, vpn in sorted(self.node.config.vpns.items())
        }


def _address(session: ClientSession) -> str:
    transport = session.conn.transport
    peername = transport.get_extra_info("peername") if transport is not None else None
    return str(peername[0]) if isinstance(peername, tuple) else str(peername)


def _buckets(events: int | None, volume: int | None) -> Buckets:
    return (TokenBucket(events, events) if events else None, TokenBucket(volume, volume) if volume else None)


def _take(buckets: Buckets, size: int, now: float) -> tuple[str, float]:
    """("", 0) when one event of ``size`` bytes is taken from both buckets, else (the limit it
    passes, its rate), taking nothing."""
    events, volume = buckets
    if events is not None and not events.take(1, now):
        return "events_per_second", events.rate
    if volume is not None and not volume.take(size, now):
        if events is not None:
            events.tokens += 1
        return "bytes_per_second", volume.rate
    return "", 0.0


def _give_back(buckets: Buckets, size: int) -> None:
    """An event taken from ``buckets`` was not published after all: it does not count."""
    events, volume = buckets
    if events is not None:
        events.tokens += 1
    if volume is not None:
        volume.tokens += size
