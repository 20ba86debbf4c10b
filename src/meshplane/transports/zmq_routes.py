"""What a ZeroMQ publisher sends while no subscription has reached its socket: libzmq drops it there,
silently (the slow joiner; in broker mode, the hop to brokers that have not forwarded a subscription
yet). It is counted where it happens: while the socket has no subscription, the publisher's senders are
wrapped by counting ones, which ask the socket each time; the first subscription puts the fast senders
back, and a heartbeat that finds none left wraps them again."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from meshplane.core.envelope import EventEnvelope
from meshplane.transports.zmq_messages import read_subscriptions

if TYPE_CHECKING:
    from meshplane.transports.zmq import XPubPublisher


class RouteWatch:
    """Counts, in ``publisher.unrouted``, the events it hands its socket while no one subscribed."""

    def __init__(self, publisher: XPubPublisher) -> None:
        self._publisher = publisher
        # the fast senders, while wrapped (kept after: a caller may hold a wrapper across a loop)
        self._fast: tuple[Any, Any, Any, Callable[[EventEnvelope], None]] | None = None
        self._armed = False

    def routed(self) -> bool:
        """Whether any subscription (of the topic, or a prefix of it) has reached the socket."""
        p = self._publisher
        if p._socket is not None:
            read_subscriptions(p._socket, p._subscriptions)
        return p._subscriptions.plain > 0 or p._subscriptions.other > 0

    def check(self) -> None:
        """Wrap the senders while nothing is routed (at start, and at each heartbeat)."""
        p = self._publisher
        if self._armed or p._socket is None or self.routed():
            return
        self._fast = (p.send_now, p.send_payload, p.send_payloads, p._send_event)
        self._armed = True
        p.send_now = self._one if p.send_now is not None else None
        p.send_payload = self._payload if p.send_payload is not None else None
        p.send_payloads = self._payloads if p.send_payloads is not None else None
        p._send_event = self._one

    def _unrouted(self) -> bool:
        """Whether nothing is routed yet; once something is, the fast senders go back in place."""
        if not self._armed:
            return False
        if not self.routed():
            return True
        self._armed = False
        p = self._publisher
        if p._socket is not None and self._fast is not None:  # closed: close() put its own senders
            p.send_now, p.send_payload, p.send_payloads, p._send_event = self._fast
        return False

    def _one(self, envelope: EventEnvelope) -> None:
        assert self._fast is not None
        if self._unrouted():
            self._publisher.unrouted += 1
        self._fast[3](envelope)

    def _payload(self, sequence: int, payload: bytes) -> int:
        assert self._fast is not None
        unrouted = self._unrouted()
        refused: int = self._fast[1](sequence, payload)
        if unrouted and not refused:
            self._publisher.unrouted += 1
        return refused

    def _payloads(self, first: int, payloads: list[bytes], start: int) -> tuple[int, int]:
        assert self._fast is not None
        unrouted = self._unrouted()
        sent, refused = self._fast[2](first, payloads, start)
        if unrouted:
            self._publisher.unrouted += sent
        return sent, refused
