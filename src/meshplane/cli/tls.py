"""``meshplane tls``: a private CA and the certificates of mesh nodes, gateways, mates, clients and
servers, named as the mesh checks them (:mod:`meshplane.certs`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, cast

from meshplane import certs

ROLES = {
    "node": "a mesh node (--mesh-tls-cert of `serve --node-id ID`): meshplane://node/CLUSTER/ID, DNS:ID",
    "gateway": "a gateway node: as a node, and DNS:CLUSTER (its gateway link is checked against it)",
    "mate": "the HA mate of node ID on another machine (same id and cluster): written to ID-mate.pem",
    "client": "a mesh client (MESHPLANE_MESH_TLS_CERT, MeshClient(tls=...)): meshplane://client/NAME",
    "server": "an HTTPS streams server or a nats-server (serve --tls-cert): its hosts only",
}


def add_tls_commands(commands: Any) -> None:
    tls = commands.add_parser(
        "tls",
        help="make a private CA and certificates for nodes, gateways, mates, clients and servers",
        description="Make a CA (`meshplane tls ca`), then certificates it signs, named as the mesh checks "
        "them (docs/security.md). Files go to --dir (default ./certs): NAME.pem and NAME.key; keys are "
        "written 0600 and never printed, and nothing is overwritten without --force.",
    )
    actions = tls.add_subparsers(dest="action", required=True, metavar="ACTION")
    ca = actions.add_parser(
        "ca", help="a new CA: DIR/ca.pem (give it to every process), DIR/ca.key (keep it safe)"
    )
    ca.add_argument("--name", default="meshplane CA", help="the CA's common name (default 'meshplane CA')")
    ca.add_argument("--days", type=int, default=3650, help="valid for this many days (default 3650)")
    _common(ca)
    for role, text in ROLES.items():
        issue = actions.add_parser(role, help=text, description=text)
        named = role in ("client", "server")
        issue.add_argument(
            "name",
            metavar="NAME" if named else "ID",
            help="the client's or server's name" if named else "the node id (serve --node-id)",
        )
        if role in ("node", "gateway", "mate"):
            issue.add_argument(
                "--cluster",
                default="meshplane",
                help="the node's cluster (serve --cluster, default meshplane)",
            )
        issue.add_argument(
            "--host",
            action="append",
            metavar="HOST|IP",
            help="a host name or address the certificate is reached at (repeat; default 127.0.0.1 and "
            "localhost); clients check it against the address they dial",
        )
        issue.add_argument("--out", type=Path, metavar="PEM", help="certificate file (key beside it, .key)")
        issue.add_argument("--days", type=int, default=825, help="valid for this many days (default 825)")
        _common(issue)
    show = actions.add_parser("show", help="the names, issuer and validity of a certificate file")
    show.add_argument("file", type=Path, help="a PEM certificate")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir", type=Path, default=Path("certs"), help="where the CA is and files go (default ./certs)"
    )
    parser.add_argument("--force", action="store_true", help="replace files that exist")


def run_tls(args: argparse.Namespace) -> int:
    if args.action == "show":
        return _show(args.file)
    if args.action == "ca":
        issued = certs.make_ca(args.dir, args.name, args.days, overwrite=args.force)
    else:
        issued = certs.issue(
            args.dir,
            cast(certs.Role, args.action),
            args.name,
            cluster=getattr(args, "cluster", "meshplane"),
            hosts=args.host or certs.DEFAULT_HOSTS,
            out=args.out,
            days=args.days,
            overwrite=args.force,
        )
    print(f"{issued.cert}: {', '.join(issued.names)}")
    print(f"{issued.key}: private key (mode 0600)")
    return 0


def _show(path: Path) -> int:
    from cryptography import x509

    from meshplane.errors import ConfigError

    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read a PEM certificate from {path}: {exc}") from None
    print(f"{path}: {', '.join(certs.describe_names(cert))}")
    print(f"  issuer {cert.issuer.rfc4514_string()}")
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    print(f"  valid {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC")
    return 0
