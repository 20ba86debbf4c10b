"""The ZeroMQ broker of broker mode: an XSUB/XPUB relay that counts everything and drops nothing silently.

Publishers connect to the XSUB side, subscribers to the XPUB side. Subscriptions (and, with
XPUB_VERBOSER, unsubscriptions) travel upstream to the publishers; events travel downstream. The relay
runs in a thread of its own, so a Python event loop never sits between two hops.

Two relays: ``c`` (the default) runs libzmq's proxy (zmq.proxy_steerable) so events never enter
Python; ``python`` moves every message through Python and counts messages exactly. The C relay counts
frames and bytes (libzmq's proxy statistics) instead of messages, exact until a drop restarts the
proxy (up to 100 ms of traffic before each drop may go uncounted); drops, subscriptions and peers
stay exact (subscriptions are seen through the proxy's capture socket, filtered in C).
"""

from __future__ import annotations

import json
import logging
import struct
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import parse_monitor_message

from meshplane.core.brokers import BrokerAddress
from meshplane.core.framing import DEFAULT_MAX_MESSAGE_BYTES, max_frame_bytes
from meshplane.errors import TransportError
from meshplane.transports.curve import Curve

log = logging.getLogger(__name__)
_BATCH = 1024
_STOP = b"stop"


@dataclass
class BrokerStats:
    """The broker's counters (read them through :meth:`Broker.stats` or the stats socket)."""

    relay: str = "c"
    messages_in: int = 0  # reported as None by the C relay, which counts frames
    messages_out: int = 0
    frames_in: int | None = None  # the C relay's counters
    frames_out: int | None = None
    bytes_in: int | None = None
    bytes_out: int | None = None
    dropped: int = 0  # refused by a full subscriber queue for longer than drop_after
    subscriptions: int = 0  # live (un)subscription balance forwarded upstream
    subscription_messages: int = 0
    publishers_connected: int = 0
    subscribers_connected: int = 0


class Broker:
    """Binds ``xsub`` and ``xpub`` (``:0`` or ``:*`` picks a free port) and relays between them."""

    def __init__(
        self,
        xsub: str = "tcp://127.0.0.1:5555",
        xpub: str = "tcp://127.0.0.1:5556",
        stats_endpoint: str | None = None,
        hwm: int = 100_000,
        drop_after: float = 0.1,
        relay: Literal["python", "c"] = "c",
        curve: Curve | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        if relay not in ("python", "c"):
            raise ValueError(f"relay must be python or c, not {relay!r}")
        self._relay_kind = relay
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._curve = curve
        self._zap: ThreadAuthenticator | None = None
        self._requested = (xsub, xpub, stats_endpoint)
        self._hwm = hwm
        self._max_message_bytes = max_message_bytes
        self._drop_after = drop_after
        self._counters = BrokerStats(relay=relay)
        self._proxy_lock = threading.Lock()
        self._proxy_run = 0
        self._proxy_base = [0] * 8  # libzmq statistics of the proxy runs that ended (after drops)
        self._proxy_last = [0] * 8  # the latest statistics of the running proxy
        self._thread: threading.Thread | None = None
        self._control_endpoint = f"inproc://meshplane-broker-{id(self):x}"
        self.address: BrokerAddress | None = None
        self.stats_endpoint: str | None = None

    def stats(self) -> dict[str, Any]:
        if self._relay_kind == "c":
            with self._proxy_lock:
                total = [a + b for a, b in zip(self._proxy_base, self._proxy_last, strict=True)]
            # libzmq order: frontend in (frames, bytes), frontend out, backend in, backend out.
            counters = self._counters
            counters.frames_in, counters.bytes_in = total[0], total[1]
            counters.frames_out, counters.bytes_out = total[6], total[7]
            return {**asdict(counters), "messages_in": None, "messages_out": None}
        return asdict(self._counters)

    def start(self) -> BrokerAddress:
        xsub_url, xpub_url, stats_url = self._requested
        ctx = self._context
        xsub, xpub = ctx.socket(zmq.XSUB), ctx.socket(zmq.XPUB)
        xsub.setsockopt(zmq.RCVHWM, self._hwm)
        xsub.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes(self._max_message_bytes))
        xpub.setsockopt(zmq.SNDHWM, self._hwm)
        xpub.setsockopt(zmq.XPUB_VERBOSER, 1)  # pass every (un)subscribe upstream
        xpub.setsockopt(zmq.XPUB_NODROP, 1)  # a full subscriber queue is an error we count, not a silent drop
        for sock in (xsub, xpub):
            sock.setsockopt(zmq.LINGER, 0)
            if self._curve is not None:
                self._curve.serve(sock)
        if self._curve is not None and self._zap is None:
            self._zap = self._curve.authenticator(ctx)
        stats = ctx.socket(zmq.REP) if stats_url else None
        try:
            xsub.bind(_bindable(xsub_url))
            xpub.bind(_bindable(xpub_url))
            if stats is not None and stats_url:
                stats.bind(_bindable(stats_url))
        except zmq.ZMQError as exc:
            for opened in (xsub, xpub, stats):
                if opened is not None:
                    opened.close(0)
            raise TransportError(f"broker cannot bind ({xsub_url}, {xpub_url}, {stats_url}): {exc}") from exc
        self.address = BrokerAddress(_bound(xsub), _bound(xpub))
        self.stats_endpoint = _bound(stats) if stats is not None else None
        control = ctx.socket(zmq.PAIR)
        control.bind(self._control_endpoint)
        # Monitors before any peer can connect: an ACCEPTED event must not be missed.
        monitors = {
            xsub.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED): "publishers_connected",
            xpub.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED): "subscribers_connected",
        }
        relay = self._relay if self._relay_kind == "python" else self._relay_c
        self._thread = threading.Thread(
            target=relay, args=(xsub, xpub, stats, control, monitors), name="meshplane-broker", daemon=True
        )
        self._thread.start()
        log.info("broker relaying %s -> %s", self.address.xsub, self.address.xpub)
        return self.address

    def stop(self) -> None:
        if self._thread is not None:
            control = self._context.socket(zmq.PAIR)
            control.connect(self._control_endpoint)
            control.send(_STOP)
            self._thread.join(10)
            control.close(0)
            self._thread = None
        if self._zap is not None:
            self._zap.stop()
            self._zap = None
        self._context.destroy(linger=0)

    def _relay(
        self,
        xsub: zmq.Socket[bytes],
        xpub: zmq.Socket[bytes],
        stats: zmq.Socket[bytes] | None,
        control: zmq.Socket[bytes],
        monitors: dict[zmq.Socket[bytes], str],
    ) -> None:
        poller = _poller(xsub, xpub, control, stats, *monitors)
        try:
            while True:
                ready = dict(poller.poll(1000))
                if control in ready:
                    return
                if xpub in ready:
                    self._forward_subscriptions(xpub, xsub)
                if xsub in ready:
                    self._forward_events(xsub, xpub)
                self._count_peers(ready, monitors)
                self._answer_stats(ready, stats)
        finally:
            for opened in (xsub, xpub, stats, control, *monitors):
                if opened is not None:
                    opened.close(0)

    def _count_subscription(self, message: bytes) -> None:
        """An XPUB (un)subscription: byte 1 (or 0), then the topic prefix."""
        counters = self._counters
        counters.subscription_messages += 1
        if message[:1] == b"\x01":
            counters.subscriptions += 1
        elif message[:1] == b"\x00":
            counters.subscriptions = max(0, counters.subscriptions - 1)

    def _count_peers(self, ready: dict[Any, int], monitors: dict[zmq.Socket[bytes], str]) -> None:
        counters = self._counters
        for monitor, name in monitors.items():
            if monitor in ready:
                event = parse_monitor_message(monitor.recv_multipart())
                delta = 1 if event["event"] == zmq.EVENT_ACCEPTED else -1
                setattr(counters, name, max(0, getattr(counters, name) + delta))

    def _answer_stats(self, ready: dict[Any, int], stats: zmq.Socket[bytes] | None) -> None:
        if stats is not None and stats in ready:
            stats.recv()
            stats.send(json.dumps(self.stats()).encode())

    # --- the C relay ----------------------------------------------------------------------------------

    def _relay_c(
        self,
        xsub: zmq.Socket[bytes],
        xpub: zmq.Socket[bytes],
        stats: zmq.Socket[bytes] | None,
        control: zmq.Socket[bytes],
        monitors: dict[zmq.Socket[bytes], str],
    ) -> None:
        """libzmq's proxy moves the events; this thread answers stats, watches peers and subscriptions."""
        ctx = self._context
        # A full subscriber queue makes the proxy's blocking send give up after drop_after: counted.
        xpub.setsockopt(zmq.SNDTIMEO, max(1, int(self._drop_after * 1000)))
        steer, steer_peer = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        steer.bind(self._control_endpoint + "-steer")
        steer_peer.connect(self._control_endpoint + "-steer")
        # The capture socket is a PUB: libzmq copies every message to it and drops, in C, all but the
        # (un)subscriptions this SUB asks for (they start with byte 1 or 0; event subjects never do).
        capture, watch = ctx.socket(zmq.PUB), ctx.socket(zmq.SUB)
        capture.bind(self._control_endpoint + "-capture")
        watch.connect(self._control_endpoint + "-capture")
        watch.setsockopt(zmq.SUBSCRIBE, b"\x00")
        watch.setsockopt(zmq.SUBSCRIBE, b"\x01")
        proxy = threading.Thread(
            target=self._run_proxy, args=(xsub, xpub, capture, steer), name="meshplane-proxy", daemon=True
        )
        proxy.start()
        poller = _poller(control, watch, stats, *monitors)
        try:
            while True:
                ready = dict(poller.poll(100))
                if control in ready:
                    return
                while watch in ready:
                    try:
                        self._count_subscription(watch.recv(zmq.NOBLOCK))
                    except zmq.Again:
                        break
                self._count_peers(ready, monitors)
                self._refresh_proxy_stats(steer_peer)
                self._answer_stats(ready, stats)
        finally:
            steer_peer.send(b"TERMINATE")
            proxy.join(5)
            for opened in (xsub, xpub, stats, control, steer, steer_peer, capture, watch, *monitors):
                if opened is not None:
                    opened.close(0)

    def _refresh_proxy_stats(self, steer_peer: zmq.Socket[bytes]) -> None:
        with self._proxy_lock:
            run = self._proxy_run
        steer_peer.send(b"STATISTICS")
        if not steer_peer.poll(1000):
            return
        values = [struct.unpack("<Q", frame)[0] for frame in steer_peer.recv_multipart()]
        with self._proxy_lock:
            if run == self._proxy_run:  # else the answer may be from either run: keep the older snapshot
                self._proxy_last = values

    def _run_proxy(
        self,
        xsub: zmq.Socket[bytes],
        xpub: zmq.Socket[bytes],
        capture: zmq.Socket[bytes],
        steer: zmq.Socket[bytes],
    ) -> None:
        counters = self._counters
        while True:
            try:
                zmq.proxy_steerable(xsub, xpub, capture, steer)
                return  # TERMINATE
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EAGAIN:
                    if exc.errno != zmq.ETERM:
                        log.error("broker proxy stopped: %s", exc)
                    return
                # A refused send leaves the rest of that message in XSUB; a spurious receive EAGAIN
                # (nothing lost) leaves RCVMORE unset. Meshplane's broker messages are multipart.
                if xsub.getsockopt(zmq.RCVMORE):
                    counters.dropped += 1
                    if counters.dropped == 1 or counters.dropped % 10_000 == 0:
                        log.warning("broker dropped %d messages: a subscriber is too slow", counters.dropped)
                    while xsub.getsockopt(zmq.RCVMORE):
                        xsub.recv()
                with self._proxy_lock:
                    self._proxy_base = [
                        a + b for a, b in zip(self._proxy_base, self._proxy_last, strict=True)
                    ]
                    self._proxy_last = [0] * 8
                    self._proxy_run += 1

    # --- the Python relay -----------------------------------------------------------------------------

    def _forward_subscriptions(self, xpub: zmq.Socket[bytes], xsub: zmq.Socket[bytes]) -> None:
        for _ in range(_BATCH):
            try:
                message = xpub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._count_subscription(message)
            xsub.send(message)

    def _forward_events(self, xsub: zmq.Socket[bytes], xpub: zmq.Socket[bytes]) -> None:
        counters = self._counters
        recv, send = xsub.recv, xpub.send
        more = zmq.SNDMORE | zmq.NOBLOCK
        for _ in range(_BATCH):
            try:
                frame = recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            counters.messages_in += 1
            # Frame by frame, as they come: once the first part is accepted the rest of the message is
            # too (ZeroMQ delivers multipart messages whole), so only the first send can be refused.
            first_flags = more if frame.more else zmq.NOBLOCK
            if not self._send_first(xpub, frame.bytes, first_flags):
                counters.dropped += 1
                if counters.dropped == 1 or counters.dropped % 10_000 == 0:
                    log.warning("broker dropped %d messages: a subscriber is too slow", counters.dropped)
                while frame.more:  # discard the rest of the refused message
                    frame = recv(zmq.NOBLOCK, copy=False)
                continue
            while frame.more:
                frame = recv(zmq.NOBLOCK, copy=False)
                send(frame.bytes, more if frame.more else zmq.NOBLOCK)
            counters.messages_out += 1

    def _send_first(self, xpub: zmq.Socket[bytes], data: bytes, flags: int) -> bool:
        try:
            xpub.send(data, flags)
            return True
        except zmq.Again:
            pass
        # A subscriber's queue is full (XPUB_NODROP): wait a little for it (backpressure), then give up.
        deadline = time.monotonic() + self._drop_after
        while time.monotonic() < deadline:
            time.sleep(0.0005)
            try:
                xpub.send(data, flags)
                return True
            except zmq.Again:
                continue
        return False


def _poller(*sockets: zmq.Socket[bytes] | None) -> zmq.Poller:
    poller = zmq.Poller()
    for sock in sockets:
        if sock is not None:
            poller.register(sock, zmq.POLLIN)
    return poller


def _bindable(endpoint: str) -> str:
    """``tcp://host:0`` means any free port, as with sockets."""
    return endpoint[:-2] + ":*" if endpoint.startswith("tcp://") and endpoint.endswith(":0") else endpoint


def _bound(sock: zmq.Socket[bytes]) -> str:
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def query_stats(endpoint: str, timeout: float = 5.0) -> dict[str, Any]:
    """Ask a running broker for its counters."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(timeout * 1000))
    try:
        sock.connect(endpoint)
        sock.send(b"stats")
        result: dict[str, Any] = json.loads(sock.recv())
        return result
    except zmq.Again:
        raise TransportError(f"no broker answered on {endpoint} within {timeout}s") from None
    finally:
        sock.close(0)
        ctx.term()
