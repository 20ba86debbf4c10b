"""A link's session after its handshake, sans I/O: every byte either side sends once both proofs are in
travels in records sealed with keys only the two parties of the handshake can derive.

Keys: HKDF-SHA256 (RFC 5869) of the secret the proofs used, salted with both nonces, labelled with the
role and both ids; one key per direction, so a record cannot be sent back to its sender. Python's
``ssl`` (3.11) has no TLS exporter (RFC 9266), so under TLS the keys are not bound to the TLS session
either: they are bound to the handshake, which a relay can forward but not finish.

A record is ``length (4 bytes, big-endian) | AES-256-GCM(frames) | tag (16)``, its nonce the record's
number in its direction (never sent: a record replayed, dropped or reordered fails to open). Records
carry a byte stream, not frames: the frame reader reads what they hold as it read the socket before.
The dialler's first record is empty: it confirms it holds the keys, and only then does the node
install the link (a stranger that relayed the handshake is never installed).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

KEY_BYTES = 32
TAG_BYTES = 16
RECORD_BYTES = 256 * 1024  # plaintext per record, at most: what a reader holds before it can open one
_LENGTH = struct.Struct(">I")
_NONCE = struct.Struct(">4xQ")
MAX_SEALED = RECORD_BYTES + TAG_BYTES


class SessionError(ValueError):
    """A record that does not open: forged, replayed, reordered or cut (the connection is lost)."""


@dataclass(frozen=True)
class SessionKeys:
    dialler_to_node: bytes
    node_to_dialler: bytes

    def sealer(self, dialler: bool) -> Sealer:
        return Sealer(self.dialler_to_node if dialler else self.node_to_dialler)

    def opener(self, dialler: bool) -> Opener:
        return Opener(self.node_to_dialler if dialler else self.dialler_to_node)


def session_keys(
    secret: bytes, *, dialler_nonce: bytes, node_nonce: bytes, role: str, dialler_id: str, node_id: str
) -> SessionKeys:
    """Both directions' keys for the handshake these arguments describe (the proofs' inputs)."""
    info = b"\x00".join((b"meshplane-session-3", role.encode(), dialler_id.encode(), node_id.encode()))
    hkdf = HKDF(hashes.SHA256(), 2 * KEY_BYTES, dialler_nonce + node_nonce, info)
    material = hkdf.derive(secret)
    return SessionKeys(material[:KEY_BYTES], material[KEY_BYTES:])


class Sealer:
    """Bytes to records, in order."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self._number = 0

    def seal(self, data: bytes) -> bytes:
        """``data`` as one record or more (an empty ``data``: one empty record)."""
        if len(data) <= RECORD_BYTES:
            return self._record(data)
        view = memoryview(data)
        return b"".join(self._record(view[i : i + RECORD_BYTES]) for i in range(0, len(data), RECORD_BYTES))

    def _record(self, data: bytes | memoryview) -> bytes:
        sealed = self._aead.encrypt(_NONCE.pack(self._number), data, None)
        self._number += 1
        return _LENGTH.pack(len(sealed)) + sealed


class Opener:
    """Records to bytes, in order: ``feed`` what the socket read, get what the records held."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self._number = 0
        self._buffer = bytearray()
        self.opened = 0  # records opened so far

    @property
    def pending(self) -> int:
        """Bytes of a record not yet whole."""
        return len(self._buffer)

    def feed(self, data: bytes) -> bytes:
        """What the whole records read so far hold; SessionError on one that does not open."""
        buffer = self._buffer
        if buffer:
            buffer += data
            source: bytes | bytearray = buffer
        else:
            source = data
        size, start, out = len(source), 0, []
        view = memoryview(source)
        try:
            while size - start >= _LENGTH.size:
                (length,) = _LENGTH.unpack_from(source, start)
                if not TAG_BYTES <= length <= MAX_SEALED:
                    raise SessionError(f"a record of {length} bytes ({TAG_BYTES}-{MAX_SEALED})")
                end = start + _LENGTH.size + length
                if end > size:
                    break
                try:
                    out.append(self._aead.decrypt(_NONCE.pack(self._number), view[start + 4 : end], None))
                except InvalidTag:
                    raise SessionError("a record that does not open: forged, replayed or reordered") from None
                self._number += 1
                self.opened += 1
                start = end
        finally:
            view.release()
        if source is buffer:
            del buffer[:start]
        else:
            self._buffer = bytearray(data[start:]) if start < size else bytearray()
        return out[0] if len(out) == 1 else b"".join(out)
