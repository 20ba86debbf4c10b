"""ZeroMQ CURVE (libzmq's CurveZMQ): publishers, subscribers and brokers that encrypt and authenticate.

Keys are ``zmq.auth`` certificate files (``meshplane curve-keys NAME`` or ``zmq.auth.create_certificates``
makes a pair: ``NAME.key`` public, ``NAME.key_secret`` both). With CURVE on:

- a publisher (direct mode) or broker is a CURVE server; a ZAP handler admits only clients whose
  public key is in the allowed folder (``*.key`` files), or any client if no folder is given;
- a publisher's discovery record carries its public key; a subscriber connects only to publishers
  whose key it trusts (the same allowed folder), so a forged record cannot point it at a rogue
  publisher, and a record pointing at another process's endpoint fails the handshake;
- in broker mode clients check the brokers' public key (one key for the brokers of a deployment).

With CURVE off nothing changes on the wire: Dynamo peers interoperate as before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from meshplane.errors import ConfigError

log = logging.getLogger(__name__)


def _load(path: Path, *, secret: bool) -> tuple[bytes, bytes | None]:
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the CURVE certificate {path}: {exc}") from None
    if secret and secret_key is None:
        raise ConfigError(f"{path} holds no secret key (use the .key_secret file)")
    return public, secret_key


def parse_public_key(text: str) -> bytes:
    """A public key: 40 Z85 characters, or the path of a ``.key`` certificate file."""
    if len(text) == 40 and not Path(text).exists():
        return text.encode()
    return _load(Path(text), secret=False)[0]


@dataclass(frozen=True, slots=True)
class Curve:
    public: bytes
    secret: bytes
    allowed: Path | None  # folder of trusted public keys; None: any key (encryption, no authentication)
    trusted: frozenset[bytes] | None
    broker_key: bytes | None

    @classmethod
    def load(cls, cert: Path, allowed: Path | None = None, broker_key: str | None = None) -> Curve:
        public, secret = _load(cert, secret=True)
        assert secret is not None
        trusted = None
        if allowed is not None:
            if not allowed.is_dir():
                raise ConfigError(f"the CURVE allowed-keys folder {allowed} does not exist")
            trusted = frozenset(_load(p, secret=False)[0] for p in sorted(allowed.glob("*.key")))
        return cls(public, secret, allowed, trusted, parse_public_key(broker_key) if broker_key else None)

    def trusts(self, key: bytes) -> bool:
        return self.trusted is None or key in self.trusted

    def serve(self, sock: zmq.Socket[bytes]) -> None:
        """Make ``sock`` a CURVE server (before it binds)."""
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_server = True

    def client(self, sock: zmq.Socket[bytes], server_key: bytes | None = None) -> None:
        """Make ``sock`` a CURVE client; connections made after this check ``server_key``."""
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        if server_key is not None:
            sock.curve_serverkey = server_key

    def authenticator(self, context: zmq.Context[zmq.Socket[bytes]]) -> ThreadAuthenticator:
        """The ZAP handler of ``context``'s CURVE servers: the allowed keys, or any key."""
        auth = ThreadAuthenticator(context, log=logging.getLogger("meshplane.curve.zap"))
        auth.start()
        location = str(self.allowed) if self.allowed is not None else zmq.auth.CURVE_ALLOW_ANY
        auth.configure_curve(domain="*", location=location)
        return auth
