"""MQTT over WebSocket (``serve --mqtt-ws-port``; MQTT 5 section 6, as mosquitto's ``protocol websockets``).

A WebSocket (aiohttp's server) is only another byte stream under the TCP door's connection: each binary
message's bytes go to an :class:`~.mqtt_connection.MqttConnection` through :class:`WsTransport`, so its
rules, limits, counters, VPNs and permissions apply unchanged. MQTT packets may span messages and a message
may hold several (the reader is a stream reader). The handshake must offer the subprotocol ``mqtt``
(else 400, counted ``ws_no_subprotocol``) and come within the CONNECT deadline; a text message closes
the connection (1003, counted ``ws_text_frame``); a message larger than the door's largest packet is
refused by aiohttp (1009, counted ``ws_message_too_big``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import WebSocketError, WSCloseCode, WSMsgType, hdrs, web
from aiohttp.web_protocol import RequestHandler

from meshplane.mesh.doors.mqtt_connection import MqttConnection
from meshplane.mesh.preauth import Unproven

if TYPE_CHECKING:
    from meshplane.mesh.config import MeshConfig
    from meshplane.mesh.doors.mqtt import MqttDoor

log = logging.getLogger(__name__)

SUBPROTOCOL = "mqtt"
CLOSE_TIMEOUT = 10.0  # seconds for what was written and the close frame to leave
HEADER_BYTES = 5  # a packet's fixed header beside its remaining length (the door's max packet size)


async def listen(
    factory: Callable[[], asyncio.BaseProtocol], config: MeshConfig, port: int, tls: ssl.SSLContext | None
) -> asyncio.Server:
    """A door's listener on the node's host, with its TLS (the handshake within the auth timeout)."""
    return await asyncio.get_running_loop().create_server(
        factory,
        config.host,
        port,
        reuse_address=True,
        ssl=tls,
        ssl_handshake_timeout=config.limits.auth_timeout if tls is not None else None,
    )


class WsTransport(asyncio.Transport):
    """What an :class:`MqttConnection` writes to, on a WebSocket: each write one binary message, sent in
    order by one task; its unsent bytes count as the socket's (the door's slow-consumer bound)."""

    def __init__(self, ws: web.WebSocketResponse, tcp: asyncio.Transport | None) -> None:
        super().__init__()
        self.ws = ws
        self.tcp = tcp
        self.readable = asyncio.Event()
        self.readable.set()
        self._out: deque[bytes] = deque()
        self._out_bytes = 0
        self._closing = False
        self._sender: asyncio.Task[None] | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        self._out.append(bytes(data))
        self._out_bytes += len(data)
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        try:
            while self._out:
                data = self._out[0]
                await self.ws.send_bytes(data)
                self._out.popleft()
                self._out_bytes -= len(data)
            if self._closing:
                await self.ws.close()
        except (ConnectionError, RuntimeError):  # gone under us: the reading side sees it
            self.abort()
        finally:
            self._sender = None

    async def drained(self) -> None:
        """What was written sent, else cut after ``CLOSE_TIMEOUT`` (a peer not reading holds nothing
        for ever): the handler's return ends the connection."""
        if self._sender is not None:
            _, stuck = await asyncio.wait([self._sender], timeout=CLOSE_TIMEOUT)
            if stuck:
                self.abort()

    def close(self) -> None:
        """Closed after what was written (a close frame follows it)."""
        if self._closing:
            return
        self._closing = True
        self.readable.set()  # the reading loop, paused or not, sees its connection closing
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._send())

    def abort(self) -> None:
        self._closing = True
        self.readable.set()
        self._out.clear()
        self._out_bytes = 0
        if self.tcp is not None:
            self.tcp.abort()

    def is_closing(self) -> bool:
        return self._closing or self.ws.closed

    def get_write_buffer_size(self) -> int:
        return self._out_bytes + (self.tcp.get_write_buffer_size() if self.tcp is not None else 0)

    def pause_reading(self) -> None:
        self.readable.clear()

    def resume_reading(self) -> None:
        self.readable.set()

    def is_reading(self) -> bool:
        return self.readable.is_set()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.tcp.get_extra_info(name, default) if self.tcp is not None else default


class Handshake(RequestHandler):
    """aiohttp's handler of one connection, admitted by its peer's address as soon as it is connected,
    before a byte of its request is read."""

    def __init__(self, listener: MqttWebSocket) -> None:
        # access_log None: no access log (aiohttp takes it, though typed as a Logger)
        super().__init__(listener.web, loop=asyncio.get_running_loop(), access_log=None)  # type: ignore[arg-type]
        self.listener = listener
        self.upgraded = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.listener.admit(self, transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.listener.handshaking.done(self)
        super().connection_lost(exc)


class MqttWebSocket:
    """The door's WebSocket listener: a handshake within the CONNECT deadline, then an MQTT connection."""

    def __init__(self, door: MqttDoor, port: int, deadline: float) -> None:
        self.door = door
        self.config_port = port
        self.deadline = deadline  # seconds from accept to the upgrade (the door's CONNECT deadline)
        self.port = 0
        limits = door.node.config.limits
        # Accepted, not yet upgraded: bounded in all (the oldest cut to make room) and per address (a
        # newcomer past its address's bound cut at once), as the node's unproven connections are.
        self.handshaking: Unproven[Handshake] = Unproven(
            limits.max_unauthenticated, limits.max_unauthenticated_per_address
        )
        self.web = web.Server(self._handle, access_log=None)
        self._server: asyncio.Server | None = None

    async def start(self, tls: ssl.SSLContext | None) -> None:
        self._server = await listen(self._accepted, self.door.node.config, self.config_port, tls)
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info("MQTT over WebSocket on %s:%d", self.door.node.config.host, self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self.web.shutdown(1.0)

    def _accepted(self) -> RequestHandler:
        return Handshake(self)

    def admit(self, handler: Handshake, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        peer = transport.get_extra_info("peername")
        refused, oldest = self.handshaking.admit(handler, str(peer[0]) if peer else "?")
        if refused:
            self.door.count(f"ws_closed_{refused}")
            transport.abort()
            return
        if oldest is not None and oldest.transport is not None:
            self.door.count("ws_closed_unproven_evicted")
            oldest.transport.abort()
        asyncio.get_running_loop().call_later(self.deadline, self._deadline, handler)

    def _deadline(self, handler: Handshake) -> None:
        if not handler.upgraded and handler.transport is not None and not handler.transport.is_closing():
            self.door.count("ws_handshake_timeout")
            handler.transport.abort()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        offered = {
            p.strip() for h in request.headers.getall(hdrs.SEC_WEBSOCKET_PROTOCOL, ()) for p in h.split(",")
        }
        if SUBPROTOCOL not in offered:
            self.door.count("ws_no_subprotocol")
            why = 'MQTT over WebSocket: offer the subprotocol "mqtt" (Sec-WebSocket-Protocol: mqtt)\n'
            return web.Response(status=400, text=why, headers={hdrs.CONNECTION: "close"})
        ws = web.WebSocketResponse(
            protocols=(SUBPROTOCOL,),
            max_msg_size=self.door.max_packet_size + HEADER_BYTES,
            timeout=CLOSE_TIMEOUT,
            compress=False,  # nothing for MQTT to gain, and no inflating of what a client sends
        )
        if not ws.can_prepare(request).ok:
            self.door.count("ws_not_websocket")
            return web.Response(status=400, text="MQTT over WebSocket: a WebSocket upgrade expected\n")
        await ws.prepare(request)
        handshake = request.protocol
        if isinstance(handshake, Handshake):
            handshake.upgraded = True
            self.handshaking.done(handshake)
        transport = WsTransport(ws, request.transport)
        conn = MqttConnection(self.door)
        conn.connection_made(transport)
        try:
            await self._read(ws, transport, conn)
        finally:
            conn.connection_lost(None)
            transport.close()
            await transport.drained()
        return ws

    async def _read(self, ws: web.WebSocketResponse, transport: WsTransport, conn: MqttConnection) -> None:
        while not conn.closing:
            await transport.readable.wait()  # paused: aiohttp's bounded queue then stops the socket
            message = await ws.receive()
            if message.type is WSMsgType.BINARY:
                conn.data_received(message.data)
            elif message.type is WSMsgType.TEXT:  # MQTT 5 section 6: binary data frames only
                self.door.count("ws_text_frame")
                await ws.close(code=1003, message=b"MQTT over WebSocket takes binary messages only")
                return
            else:
                error = message.data if message.type is WSMsgType.ERROR else None
                if isinstance(error, WebSocketError) and error.code == WSCloseCode.MESSAGE_TOO_BIG:
                    self.door.count("ws_message_too_big")
                return
