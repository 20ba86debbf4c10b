"""Certificates for meshplane's TLS (``meshplane tls``): a private CA and the certificates it signs.

The identities the mesh checks (docs/security.md):

- a member of a cluster (a node, its gateway, its HA mate) carries the URI
  ``meshplane://node/<cluster>/<node-id>`` and its node id as a DNS name and common name (a gateway
  also its cluster as a DNS name, which a gateway's link is checked against);
- a client carries ``meshplane://client/<name>`` and its name as the common name;
- every certificate also names the hosts and addresses it is reached at (DNS and IP subject
  alternative names: 127.0.0.1 and localhost by default), so that clients can check host names.

Keys are ECDSA P-256, written 0600 and never printed; a file already there is never overwritten
unless asked.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from meshplane.errors import ConfigError

Role = Literal["node", "gateway", "mate", "client", "server"]
DEFAULT_HOSTS = ("127.0.0.1", "localhost")
CA_FILES = ("ca.pem", "ca.key")


def member_uri(cluster: str, node_id: str) -> str:
    return f"meshplane://node/{cluster}/{node_id}"


def client_uri(name: str) -> str:
    return f"meshplane://client/{name}"


@dataclass(frozen=True)
class Issued:
    """What was written: the certificate, its key and the names it carries."""

    cert: Path
    key: Path
    names: list[str]


def check_name(what: str, value: str) -> None:
    """A name in a certificate's identity and in its file's name: printable ASCII of 1-64 characters
    without ``/`` (``a/b`` in cluster ``x`` would name node ``b`` of cluster ``x/a``; ``../`` would
    write outside the folder), not starting with a dot."""
    if not (0 < len(value) <= 64 and value.isascii() and value.isprintable()) or "/" in value:
        raise ConfigError(f"{what} {value[:80]!r}: 1-64 printable ASCII characters without '/'")
    if value.startswith(".") or "\\" in value:
        raise ConfigError(f"{what} {value[:80]!r} may not start with '.' nor hold a backslash")


def _write(path: Path, data: bytes, mode: int, overwrite: bool) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # made here: the owner's alone
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
    try:
        fd = os.open(path, flags, mode)
    except FileExistsError:
        raise ConfigError(f"{path} exists: remove it, or pass --force to replace it") from None
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(path, mode)  # an existing file replaced with --force keeps no looser mode


def _key_bytes(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def make_ca(folder: Path, name: str = "meshplane CA", days: int = 3650, overwrite: bool = False) -> Issued:
    """A CA: ``folder/ca.pem`` (give it to every process) and ``folder/ca.key`` (keep it offline)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks a little behind still accept it
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / CA_FILES[0], folder / CA_FILES[1]
    _write(key_path, _key_bytes(key), 0o600, overwrite)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644, overwrite)
    return Issued(cert_path, key_path, [f"CN={name}"])


def _load_ca(folder: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = folder / CA_FILES[0], folder / CA_FILES[1]
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except FileNotFoundError as exc:
        missing = exc.filename
        raise ConfigError(
            f"no CA in {folder} ({missing} is missing): meshplane tls ca --dir {folder}"
        ) from None
    except ValueError as exc:
        raise ConfigError(f"the CA in {folder} is unreadable: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{key_path}: expected the EC key `meshplane tls ca` writes")
    return cert, key


def _host_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def issue(
    folder: Path,
    role: Role,
    name: str,
    *,
    cluster: str = "meshplane",
    hosts: Sequence[str] = DEFAULT_HOSTS,
    out: Path | None = None,
    days: int = 825,
    overwrite: bool = False,
) -> Issued:
    """A certificate for ``role`` signed by the CA in ``folder``, written to ``out`` (default
    ``folder/<name>.pem``, a mate's ``folder/<name>-mate.pem``) and its key beside it (``.key``)."""
    for what, value in (("name", name), ("cluster", cluster)):
        check_name(what, value)
    ca_cert, ca_key = _load_ca(folder)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    if role in ("node", "gateway", "mate"):
        sans.append(x509.UniformResourceIdentifier(member_uri(cluster, name)))
        sans.append(x509.DNSName(name))
        if role == "gateway" and cluster.lower() != name.lower():
            sans.append(x509.DNSName(cluster))  # a gateway's link is checked against its cluster
    elif role == "client":
        sans.append(x509.UniformResourceIdentifier(client_uri(name)))
    sans += [n for n in _host_names(hosts) if n not in sans]
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if role == "client" else [ExtendedKeyUsageOID.SERVER_AUTH]
    if role in ("node", "gateway", "mate"):  # members both accept and dial links
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path = out or folder / (f"{name}-mate.pem" if role == "mate" else f"{name}.pem")
    key_path = cert_path.with_suffix(".key")
    _write(key_path, _key_bytes(key), 0o600, overwrite)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644, overwrite)
    return Issued(cert_path, key_path, describe_names(cert))


def describe_names(cert: x509.Certificate) -> list[str]:
    """The names a certificate carries: ``CN=a``, ``URI:...``, ``DNS:a``, ``IP:...``, as openssl shows."""
    names = [f"CN={a.value!s}" for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return names
    kinds = ((x509.UniformResourceIdentifier, "URI"), (x509.DNSName, "DNS"), (x509.IPAddress, "IP"))
    for kind, label in kinds:
        names += [f"{label}:{value}" for value in sans.get_values_for_type(kind)]
    return names


def names_of_der(der: bytes) -> list[str]:
    return describe_names(x509.load_der_x509_certificate(der))


async def presented_names(host: str, port: int, timeout: float = 3.0) -> list[str] | None:
    """The names on the certificate a TLS server at host:port presents, read without verifying it:
    for saying why verification failed. None when it cannot be read."""
    import asyncio

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(host, port, ssl=context)
    except (OSError, TimeoutError):
        return None
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        return names_of_der(der) if der else None
    finally:
        writer.close()


async def refusal(what: str, host: str, port: int, reason: object, trust: str) -> str:
    """What to say when ``what`` at host:port answered and its certificate was refused: the name that
    was expected and the names the certificate has, rather than "cannot reach"."""
    names = await presented_names(host, port)
    has = f"it names {', '.join(names)}" if names else "its names could not be read"
    return (
        f"{what} answered, but its TLS certificate was refused ({reason}): expected one naming {host!r} "
        f"signed by the CA in {trust}; {has}. Dial a name the certificate carries, or make one for this "
        f"host (meshplane tls ... --host {host})"
    )
