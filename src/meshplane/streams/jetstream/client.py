"""The NATS client the JetStream backend connects with: nats-py's, with a faster header parser.

Every message a read fetches (a batched direct get) carries seven header lines; nats-py 2.16 spends
half of a read's time splitting them with a per-character check. This parser gives the same result
(a differential test holds it to nats-py's) for text headers, about three times faster, and leaves
anything else to nats-py's. A nats-py that parses headers otherwise never calls it.
"""

from __future__ import annotations

from nats.aio.client import Client

# What ``bytes.strip()`` strips (nats-py strips bytes; ``str.strip()`` would strip more).
_ASCII_SPACE = " \t\n\r\x0b\x0c"


class StoreClient(Client):
    @staticmethod
    def _parse_header_lines(raw: bytes) -> dict[str, str]:
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            return Client._parse_header_lines(raw)
        out: dict[str, str] = {}
        for line in text.split("\r\n"):
            name, sep, value = line.partition(":")
            key = name.strip(_ASCII_SPACE)
            if sep and key.isascii() and key == "".join(key.split()):  # no whitespace inside
                out[key] = value.strip(_ASCII_SPACE)
        return out
