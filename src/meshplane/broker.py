"""The ZeroMQ broker of broker mode: an XSUB/XPUB relay that counts everything and drops nothing silently.

Publishers connect to the XSUB side, subscribers to the XPUB side. Subscriptions (and, with
XPUB_VERBOSER, unsubscriptions) travel upstream to the publishers; events travel downstream. The relay
runs in a thread of its own, so a Python event loop never sits between two hops.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from meshplane.core.brokers import BrokerAddress
from meshplane.errors import TransportError

log = logging.getLogger(__name__)
_BATCH = 1024
_STOP = b"stop"


@dataclass
class BrokerStats:
    """The broker's counters (read them through :meth:`Broker.stats` or the stats socket)."""

    messages_in: int = 0
    messages_out: int = 0
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
    ) -> None:
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._requested = (xsub, xpub, stats_endpoint)
        self._hwm = hwm
        self._drop_after = drop_after
        self._counters = BrokerStats()
        self._thread: threading.Thread | None = None
        self._control_endpoint = f"inproc://meshplane-broker-{id(self):x}"
        self.address: BrokerAddress | None = None
        self.stats_endpoint: str | None = None

    def stats(self) -> dict[str, Any]:
        return asdict(self._counters)

    def start(self) -> BrokerAddress:
        xsub_url, xpub_url, stats_url = self._requested
        ctx = self._context
        xsub, xpub = ctx.socket(zmq.XSUB), ctx.socket(zmq.XPUB)
        xsub.setsockopt(zmq.RCVHWM, self._hwm)
        xpub.setsockopt(zmq.SNDHWM, self._hwm)
        xpub.setsockopt(zmq.XPUB_VERBOSER, 1)  # pass every (un)subscribe upstream
        xpub.setsockopt(zmq.XPUB_NODROP, 1)  # a full subscriber queue is an error we count, not a silent drop
        for sock in (xsub, xpub):
            sock.setsockopt(zmq.LINGER, 0)
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
        self._thread = threading.Thread(
            target=self._relay, args=(xsub, xpub, stats, control), name="meshplane-broker", daemon=True
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
        self._context.destroy(linger=0)

    def _relay(
        self,
        xsub: zmq.Socket[bytes],
        xpub: zmq.Socket[bytes],
        stats: zmq.Socket[bytes] | None,
        control: zmq.Socket[bytes],
    ) -> None:
        monitors = {
            xsub.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED): "publishers_connected",
            xpub.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED): "subscribers_connected",
        }
        poller = zmq.Poller()
        for sock in (xsub, xpub, control, *monitors):
            poller.register(sock, zmq.POLLIN)
        if stats is not None:
            poller.register(stats, zmq.POLLIN)
        counters = self._counters
        try:
            while True:
                ready = dict(poller.poll(1000))
                if control in ready:
                    return
                if xpub in ready:
                    self._forward_subscriptions(xpub, xsub)
                if xsub in ready:
                    self._forward_events(xsub, xpub)
                if stats is not None and stats in ready:
                    stats.recv()
                    stats.send(json.dumps(self.stats()).encode())
                for monitor, name in monitors.items():
                    if monitor in ready:
                        event = parse_monitor_message(monitor.recv_multipart())
                        delta = 1 if event["event"] == zmq.EVENT_ACCEPTED else -1
                        setattr(counters, name, max(0, getattr(counters, name) + delta))
        finally:
            for opened in (xsub, xpub, stats, control, *monitors):
                if opened is not None:
                    opened.close(0)

    def _forward_subscriptions(self, xpub: zmq.Socket[bytes], xsub: zmq.Socket[bytes]) -> None:
        counters = self._counters
        for _ in range(_BATCH):
            try:
                message = xpub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            counters.subscription_messages += 1
            if message[:1] == b"\x01":
                counters.subscriptions += 1
            elif message[:1] == b"\x00":
                counters.subscriptions = max(0, counters.subscriptions - 1)
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
