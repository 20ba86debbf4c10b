"""A test CA issuing mesh certificates with the identities of docs/security.md: SAN URIs
(``meshplane://node/<cluster>/<id>``, ``meshplane://client/<name>``) beside DNS names and IP
addresses (trustme issues no URIs)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


class MeshCA:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "meshplane test CA")])
        self.cert = (
            self._builder(name, name, self.key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        (folder / "ca.pem").write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    @staticmethod
    def _builder(
        subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    def issue(self, name: str, *identities: str, common_name: str = "") -> None:
        """``name``.pem and ``name``.key in the folder: each identity a URI SAN (with ``://``), an IP
        address or a DNS name."""
        sans: list[x509.GeneralName] = []
        for identity in identities:
            if "://" in identity:
                sans.append(x509.UniformResourceIdentifier(identity))
                continue
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(identity)))
            except ValueError:
                sans.append(x509.DNSName(identity))
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name or name)])
        builder = self._builder(subject, self.cert.subject, key.public_key())
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        (self.folder / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (self.folder / f"{name}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
