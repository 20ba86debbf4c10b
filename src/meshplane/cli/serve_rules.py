"""What ``meshplane serve`` refuses in a combination of settings, in one place: ``serve`` refuses it in
the terms it was given in (``--mesh-tls-cert needs --mesh-tls-key``, or ``[mesh] tls_cert needs
tls_key`` with the file's line), and ``meshplane config check`` finds it in a file before any serve.

Each rule looks at the settings (serve's parsed options, ``dest`` -> value) and, when broken, says
why with ``name(dest)`` for each setting it mentions, so the caller chooses flags or file keys."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

Name = Callable[[str], str]


@dataclass(frozen=True)
class Broken:
    dest: str  # the setting the problem is reported at (its line, in a file)
    message: str  # with every setting named by the caller's ``name``


def _pair(first: str, second: str) -> Callable[[argparse.Namespace, Name], Broken | None]:
    def rule(args: argparse.Namespace, name: Name) -> Broken | None:
        one, other = getattr(args, first, None), getattr(args, second, None)
        if (one is None) == (other is None):
            return None
        given, missing = (first, second) if one is not None else (second, first)
        return Broken(given, f"{name(given)} needs {name(missing)}: a certificate goes with its key")

    return rule


def _mesh_ca(args: argparse.Namespace, name: Name) -> Broken | None:
    if args.mesh_tls_ca is not None and args.mesh_tls_cert is None and args.mesh_tls_key is None:
        return Broken(
            "mesh_tls_ca",
            f"{name('mesh_tls_ca')} needs {name('mesh_tls_cert')} and {name('mesh_tls_key')}: "
            "a node checks its peers' certificates only over TLS of its own",
        )
    return None


def _mesh_needs_node(args: argparse.Namespace, name: Name) -> Broken | None:
    if args.node_id is not None:
        return None
    for dest in ("routes", "gateway", "nats_port"):
        if getattr(args, dest, None):
            return Broken(
                dest, f"{name(dest)} needs {name('node_id')}: a server joins a mesh as a named node"
            )
    return None


def _storage(args: argparse.Namespace, name: Name) -> Broken | None:
    if args.storage == "local":
        return None
    servers = [url.strip() for url in args.storage.split(",") if url.strip()]
    if not servers or not all(url.startswith(("nats://", "tls://")) for url in servers):
        from meshplane.core.urls import redact_url

        return Broken(
            "storage",
            f"{name('storage')} is local or nats://HOST:PORT[,...], not {redact_url(args.storage)!r}",
        )
    if args.node_id is not None:
        return Broken(
            "storage",
            f"{name('storage')} must be local on a mesh node ({name('node_id')}): it keeps its guaranteed "
            "queues locally",
        )
    return None


def _mates(args: argparse.Namespace, name: Name) -> Broken | None:
    if not args.mates_etcd:
        return None
    if args.node_id is None:
        return Broken("mates_etcd", f"{name('mates_etcd')} needs {name('node_id')}: mates are a mesh node's")
    if args.standby:
        return Broken(
            "mates_etcd",
            f"{name('mates_etcd')} and {name('standby')} do not go together: etcd's lease says which mate "
            "is active",
        )
    return None


RULES = (
    _pair("tls_cert", "tls_key"),
    _pair("mesh_tls_cert", "mesh_tls_key"),
    _mesh_ca,
    _mesh_needs_node,
    _storage,
    _mates,
)


def broken(args: argparse.Namespace, name: Name) -> list[Broken]:
    """Every rule ``args`` breaks."""
    return [found for rule in RULES if (found := rule(args, name)) is not None]
