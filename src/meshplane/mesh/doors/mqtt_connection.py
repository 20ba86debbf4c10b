"""One MQTT client on a mesh node: an asyncio protocol around the sans-I/O reader
(:mod:`meshplane.core.doors.mqtt_codec`), and a holder of the node's interest.

What a client publishes: QoS 0 as a direct event, QoS 1 as a guaranteed event, PUBACK once it is
stored wherever it must be (the node's answer to a guaranteed publish), PUBACKs in the order of the
PUBLISHes. What it receives: each event at most at the QoS of the best subscription that matches it
and of the event (guaranteed 1, direct 0). A persistent session's QoS 1 events come from its queue
(:mod:`.mqtt_sessions`), read from the last offset the client acknowledged. Everything the client can
make the node hold is bounded: its subscriptions, its QoS 1 publishes waiting to be stored (reading
stops), the QoS 1 messages it has not acknowledged (the rest wait, bounded), the bytes its socket has
not taken (past them it is cut as a slow consumer, counted).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from functools import partial
from typing import TYPE_CHECKING

from meshplane.core.doors.mqtt_codec import Item, MqttReader
from meshplane.core.doors.mqtt_expiry import payload_of, seconds_left
from meshplane.core.doors.mqtt_packets import (
    NO_PROPERTIES,
    V5,
    V311,
    Code,
    ConnAck,
    Connect,
    Disconnect,
    MqttError,
    Packet,
    PingReq,
    PingResp,
    Prop,
    Properties,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    encode,
    publish_bytes,
)
from meshplane.core.doors.mqtt_topics import to_topic
from meshplane.core.mesh.frames import FLAG_GUARANTEED
from meshplane.core.mesh.permissions import Permissions
from meshplane.core.mesh.vpn import DEFAULT, outward
from meshplane.mesh.doors.mqtt_filters import (
    MAX_SUBSCRIPTIONS,
    changed,
    drop_pattern,
    leave_shared,
    qos_for,
    take_filter,
)
from meshplane.mesh.doors.mqtt_publish import Pending, on_publish
from meshplane.mesh.doors.mqtt_retained import RetainedSender
from meshplane.mesh.doors.mqtt_sessions import Subscription, after_saved
from meshplane.mesh.holders import MeshEvent
from meshplane.mesh.preauth import bounded

if TYPE_CHECKING:
    from meshplane.mesh.doors.mqtt import MqttDoor
    from meshplane.mesh.doors.mqtt_sessions import StoredSession
    from meshplane.mesh.doors.nats_groups import QueueGroup

log = logging.getLogger(__name__)

MAX_INFLIGHT = 1000  # QoS 1 messages sent to a client and not acknowledged (or its Receive Maximum)
MAX_WAITING = 10_000  # QoS 1 messages waiting for room in flight ...
MAX_WAITING_BYTES = 16 * 1024 * 1024  # ... and their bytes
MAX_OUTBOUND_BYTES = 16 * 1024 * 1024  # unsent to the client's socket: past it, a slow consumer


class MqttConnection(asyncio.Protocol):
    def __init__(self, door: MqttDoor) -> None:
        self.door = door
        self.reader = MqttReader(door.max_packet_size)
        self.transport: asyncio.Transport | None = None
        self.address = ""
        self.level = 0
        self.client_id = ""
        self.vpn = DEFAULT
        self.prefix = ""
        self.user = ""
        self.permissions: Permissions | None = None
        self.connected = False  # CONNACK sent with success
        self.closing = False
        self.graceful = False  # a DISCONNECT came: no will
        self.will: tuple[str, bytes, int, bool] | None = None  # (subject, payload, QoS, retain)
        self.keep_alive = 0
        self.last_heard = time.monotonic()
        self.subscriptions: dict[str, Subscription] = {}  # by filter
        self.patterns: dict[str, int] = {}  # mesh pattern -> filters mapped to it
        self.shared: dict[str, tuple[QueueGroup, int]] = {}  # $share filter -> (its group, QoS)
        self.one_qos: int | None = None  # the QoS of every subscription, when they all share one
        self.no_local = False
        self.session: StoredSession | None = None  # persistent
        self.receive_maximum = MAX_INFLIGHT
        self.max_out_packet = 0  # the client's Maximum Packet Size (5), 0: none said
        self.publishes: deque[Pending] = deque()  # the client's QoS 1 PUBLISHes being stored, in order
        self.next_id = 0
        self.inflight: dict[int, int] = {}  # packet id -> queue offset (-1: a direct event)
        self.queue_offsets: OrderedDict[int, int] = OrderedDict()  # offsets in flight -> packet id
        self.waiting: deque[Publish] = deque()
        self.waiting_bytes = 0
        self.pump: asyncio.Task[None] | None = None
        self.saving: asyncio.Future[None] | None = None  # the session's subscriptions being saved
        self.retained_sender = RetainedSender(self, MAX_SUBSCRIPTIONS)
        self.room = asyncio.Event()
        self.messages_in = self.messages_out = self.dropped = 0
        self.paused_reading = False
        self.held: list[Item | MqttError] = []  # read with the CONNECT (reading waits for its answer)
        self._out: list[bytes] = []  # packets of this round, written at its end (bounded in bytes)
        self._out_bytes = 0
        self._flushing = False

    # --- asyncio ---------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if peer else "?"
        if not self.door.admit(self):
            self.closing = True
            transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.last_heard = time.monotonic()
        items: list[Item | MqttError]
        try:
            items = [*self.reader.feed_fast(data)]
        except MqttError as exc:
            items = [exc]
        else:
            if self.reader.error is not None:  # after the packets that came before it
                items.append(self.reader.error)
        self.handle(items)

    def handle(self, items: list[Item | MqttError]) -> None:
        for index, item in enumerate(items):
            if self.closing:
                return
            # They wait for its answer, or (3.1.1's QoS 1 PUBLISHes past half the Receive Maximum) for
            # the storing ones: the rest of a read as the socket's next reads do.
            if self.saving or (self.level and not self.connected) or self.paused_reading:
                self.held.extend(items[index:])
                return
            try:
                if isinstance(item, tuple):  # a plain PUBLISH read in C (MqttReader.feed_fast)
                    on_publish(self, *item)
                elif isinstance(item, int):  # a PUBACK, likewise
                    self.on_puback(item)
                elif isinstance(item, MqttError):
                    raise item
                else:
                    self.on_packet(item)
            except MqttError as exc:
                self.refuse(exc)
                return

    def release_held(self) -> None:
        """What was read while an answer was awaited (a CONNECT's, a session's save), handled now."""
        held, self.held = self.held, []
        self.handle(held)
        if self.transport is not None and not (self.closing or self.paused_reading or self.saving):
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.door.gone(self)

    # --- writing ---------------------------------------------------------------------------------

    def send(self, packet: Packet) -> None:
        """Queued for this event loop round's one write (a syscall per packet cost more than routing)."""
        self.write(encode(packet, self.level or V311))

    def write(self, data: bytes) -> None:
        """A packet's bytes, queued as :meth:`send` does."""
        if self.transport is None or self.closing:
            return
        self._out.append(data)
        self._out_bytes += len(data)
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self.flush)
        if self._out_bytes > MAX_OUTBOUND_BYTES:
            self.flush()

    def flush(self) -> None:
        self._flushing = False
        transport = self.transport
        if not self._out or transport is None or transport.is_closing():
            self._out.clear()
            self._out_bytes = 0
            return
        transport.write(b"".join(self._out))
        self._out.clear()
        self._out_bytes = 0
        if transport.get_write_buffer_size() > MAX_OUTBOUND_BYTES and not self.closing:
            self.door.count("slow_consumer")
            unread = transport.get_write_buffer_size()
            log.warning("MQTT client %s cut: %d bytes left unread", bounded(self.client_id), unread)
            self.close(Code.QUOTA_EXCEEDED, "a slow consumer: too many bytes not read", abort=True)

    def close(self, code: int = Code.SUCCESS, why: str = "", *, abort: bool = False) -> None:
        """Close (a 5 client told why with a DISCONNECT, unless the socket is stuck); what was sent
        before goes first."""
        if self.closing or self.transport is None:
            return
        if self.level == V5 and self.connected and not abort:
            props: dict[int, object] = {Prop.REASON_STRING: why[:200]} if why else {}
            self.send(Disconnect(code, props))
        self.end(abort=abort)

    def end(self, *, abort: bool = False) -> None:
        """Closed now, after what was queued (unless ``abort``: the socket is stuck)."""
        if self.transport is None:
            return
        if not abort:
            self.flush()
        self.closing = True
        if abort:
            self.transport.abort()
        else:
            self.transport.close()

    def refuse(self, exc: MqttError) -> None:
        """Bytes that break the rules: counted, logged (bounded), answered where MQTT can, closed."""
        self.door.count(exc.reason)
        self.door.quiet.warning(
            f"mqtt_{exc.reason}", "MQTT client %s from %s: %s", bounded(self.client_id), self.address, exc
        )
        if exc.in_connect and not self.connected and self.transport is not None:
            self.level = V311  # the CONNECT could not be read: answered in 3.1.1, which 5's clients read
            self.send(ConnAck(False, exc.code))
            self.end()
            return
        self.close(exc.code, str(exc))

    def reason(self, why: str) -> dict[int, object]:
        """``why`` as a Reason String property (MQTT 5 only)."""
        return {Prop.REASON_STRING: why[:200]} if self.level == V5 and why else {}

    # --- packets ---------------------------------------------------------------------------------

    def on_packet(self, packet: Packet) -> None:
        if isinstance(packet, Publish):
            p = packet
            on_publish(self, p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id, p.properties)
        elif isinstance(packet, PubAck):
            self.on_puback(packet.packet_id)
        elif isinstance(packet, Subscribe):
            self.on_subscribe(packet)
        elif isinstance(packet, Unsubscribe):
            self.on_unsubscribe(packet)
        elif isinstance(packet, PingReq):
            self.send(PingResp())
        elif isinstance(packet, Disconnect):
            self.graceful = packet.code != Code.DISCONNECT_WITH_WILL
            self.end()
        elif isinstance(packet, Connect):
            self.level = packet.level
            if self.transport is not None:
                self.transport.pause_reading()  # nothing more before the answer
            task = asyncio.get_running_loop().create_task(self.door.connect(self, packet))
            self.door.tasks.add(task)
            task.add_done_callback(self.door.tasks.discard)

    def on_puback(self, packet_id: int) -> None:
        offset = self.inflight.pop(packet_id, None)
        if offset is None:
            self.door.count("unknown_puback")
            return
        if offset >= 0:
            self.queue_offsets.pop(offset, None)
            self._acked_to()
        self.room.set()
        while self.waiting and len(self.inflight) < self.receive_maximum:
            queued = self.waiting.popleft()
            self.waiting_bytes -= len(queued.payload)
            self._send_qos1(queued.topic, queued.payload, queued.retain, -1, properties=queued.properties)

    def _acked_to(self) -> None:
        session = self.session
        if session is not None:
            session.acked = next(iter(self.queue_offsets)) if self.queue_offsets else session.sent
            self.door.sessions_dirty(session)

    def on_subscribe(self, packet: Subscribe) -> None:
        codes: list[int] = []
        new: list[tuple[str, str]] = []
        for topic_filter, options in packet.filters:
            code, pattern = take_filter(self, topic_filter, options)
            codes.append(code)
            if code < 0x80 and pattern and (options >> 4) & 3 != 2:  # retain handling 2: none sent
                new.append((topic_filter, pattern))
        refused = changed(self)
        if refused:  # not kept as its session: no SUBACK, said why (the client may try again)
            self.close(Code.QUOTA_EXCEEDED, refused)
            return
        after_saved(self, partial(self._subacked, packet.packet_id, tuple(codes), new))

    def _subacked(self, packet_id: int, codes: tuple[int, ...], new: list[tuple[str, str]]) -> None:
        self.send(SubAck(packet_id, codes))
        if not self.retained_sender.add(pattern for _, pattern in new):
            self.door.count("slow_consumer")
            self.close(Code.QUOTA_EXCEEDED, "a slow consumer: too many filters' retained messages to send")

    def on_unsubscribe(self, packet: Unsubscribe) -> None:
        codes = []
        for topic_filter in packet.filters:
            if leave_shared(self, topic_filter):
                codes.append(Code.SUCCESS)
                continue
            known = self.subscriptions.pop(topic_filter, None)
            codes.append(Code.SUCCESS if known is not None else Code.NO_SUBSCRIPTION_EXISTED)
            if known is not None:
                drop_pattern(self, known.pattern)
        refused = changed(self)
        if refused:
            self.close(Code.UNSPECIFIED, refused)
            return
        answer = UnsubAck(packet.packet_id, tuple(codes) if self.level == V5 else ())
        after_saved(self, partial(self.send, answer))

    # --- deliveries ------------------------------------------------------------------------------

    def deliver(self, event: MeshEvent) -> None:
        """An event the node routes to this client's subscriptions."""
        if self.closing or not self.connected:
            return
        qos = min(qos_for(self, event.subject), 1 if event.flags & FLAG_GUARANTEED else 0)
        if qos and self.session is not None and not event.imported:
            return  # its queue has it: sent from there, acknowledged there (queues take no imports)
        self._deliver_event(event, qos)

    def deliver_member(self, key: str, event: MeshEvent) -> None:
        """An event the group of its shared filter ``key`` chose this client for (held in flight here)."""
        if key in self.shared and not self.closing and self.connected:
            self._deliver_event(event, min(self.shared[key][1], 1 if event.flags & FLAG_GUARANTEED else 0))

    def _deliver_event(self, event: MeshEvent, qos: int) -> None:
        payload, deadline = payload_of(event.body, event.flags)
        properties = self._expiry(deadline)
        if properties is not None:
            topic = to_topic(outward(self.prefix, event.subject))
            self.deliver_publish(topic, payload, qos, properties=properties)

    def _expiry(self, deadline: int | None) -> Properties | None:
        """The seconds a message has left (MQTT 5 3.3.2.3.3); None: expired (dropped, counted)."""
        if deadline is None:
            return NO_PROPERTIES
        left = seconds_left(deadline, time.time_ns() // 1_000_000)
        if left <= 0:
            self.door.count("expired")
            return None
        return {Prop.MESSAGE_EXPIRY: left} if self.level == V5 else NO_PROPERTIES

    def deliver_publish(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        *,
        retain: bool = False,
        properties: Properties = NO_PROPERTIES,
    ) -> None:
        if self.max_out_packet and len(payload) + len(topic) + 16 > self.max_out_packet:
            self.dropped += 1  # larger than the client takes (5's Maximum Packet Size): MQTT drops it
            return
        self.messages_out += 1
        if not qos:
            self.write(self._encoded(topic, payload, 0, retain, False, 0, properties))
            return
        if len(self.inflight) < self.receive_maximum:
            self._send_qos1(topic, payload, retain, -1, properties=properties)
            return
        if len(self.waiting) >= MAX_WAITING or self.waiting_bytes + len(payload) > MAX_WAITING_BYTES:
            self.door.count("slow_consumer")
            self.close(Code.QUOTA_EXCEEDED, "a slow consumer: too many QoS 1 messages unacknowledged")
            return
        self.waiting.append(Publish(topic, payload, 1, retain, properties=properties))
        self.waiting_bytes += len(payload)

    def _packet_id(self) -> int:
        for _ in range(0x10000):
            self.next_id = self.next_id % 0xFFFF + 1
            if self.next_id not in self.inflight:
                return self.next_id
        raise RuntimeError("no free packet identifier")  # cannot happen: in flight is bounded below it

    def _send_qos1(
        self,
        topic: str,
        payload: bytes,
        retain: bool,
        offset: int,
        dup: bool = False,
        properties: Properties = NO_PROPERTIES,
    ) -> None:
        packet_id = self._packet_id()
        self.inflight[packet_id] = offset
        if offset >= 0:
            self.queue_offsets[offset] = packet_id
        self.write(self._encoded(topic, payload, 1, retain, dup, packet_id, properties))

    def _encoded(
        self, topic: str, data: bytes, qos: int, retain: bool, dup: bool, ident: int, props: Properties
    ) -> bytes:
        if props:  # else made without a packet object
            return encode(Publish(topic, data, qos, retain, dup, ident, props), self.level)
        return publish_bytes(topic, data, qos, retain, dup, ident, self.level)

    def send_from_queue(self, offset: int, topic: str, data: bytes, dup: bool, wrapped: bool = True) -> None:
        """A persistent session's message from its queue (``wrapped``: maybe an envelope)."""
        payload, deadline = payload_of(data, 0, queued=wrapped)
        properties = self._expiry(deadline)
        if properties is not None:
            self.messages_out += 1
            self._send_qos1(topic, payload, False, offset, dup, properties)
