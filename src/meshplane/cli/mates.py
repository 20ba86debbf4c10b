"""``meshplane mesh mates``: etcd's view of a node's HA mates (active, epoch, ``current``, each mate's
token and whether it runs), and ``mates reset``, the way out when every mate ``current`` names is gone
for good (both data directories replaced, say): without it each new mate waits forever, as none may
take over without what the named ones acknowledged."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from meshplane.cli.errors import CliError

if TYPE_CHECKING:
    from meshplane.mesh.lease import MateLease

OPERATOR = "operator"  # the token the command reads etcd as: it never takes the lease


def mate_lease(
    endpoints: str, cluster: str, node_id: str, token: str, ttl: int = 3, *, secret: str = ""
) -> MateLease:
    """A node's lease in etcd at ``endpoints`` (comma-separated), with TLS as the plane configures it;
    ``secret``, the members', signs and checks its records."""
    from meshplane.config import PlaneConfig
    from meshplane.discovery.etcd import EtcdTls
    from meshplane.mesh.lease import MateLease

    listed = tuple(e.strip() for e in endpoints.split(",") if e.strip())
    plane = PlaneConfig.from_env()
    use_tls = any(e.startswith("https://") for e in listed) or plane.etcd_tls_ca is not None
    credentials = (
        EtcdTls(plane.etcd_tls_ca, plane.etcd_tls_cert, plane.etcd_tls_key).credentials() if use_tls else None
    )
    return MateLease(listed, cluster, node_id, token, ttl=ttl, credentials=credentials, secret=secret)


def add_mates_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("operation", nargs="?", choices=["reset"], help="reset: delete etcd's current")
    parser.add_argument("--etcd", required=True, help="etcd endpoints, as the mates' --mates-etcd")
    parser.add_argument("--node", required=True, help="the node id the mates share")
    parser.add_argument("--cluster", default="meshplane", help="the mates' --cluster (default: meshplane)")
    parser.add_argument("--yes", action="store_true", help="reset: do it (without: say what it would lose)")


async def run_mates(args: argparse.Namespace) -> int:
    from meshplane.mesh.config import MEMBER_SECRET_ENV, secret_from_env

    # The members' secret checks the records (a record that fails it is shown as nobody's).
    secret = secret_from_env(MEMBER_SECRET_ENV)
    lease = mate_lease(args.etcd, args.cluster, args.node, OPERATOR, secret=secret)
    try:
        view = await lease.view()
        if args.operation != "reset":
            _show(view)
            return 0
        await _reset(lease, view, args)
        return 0
    finally:
        await lease.close()


def _show(view: dict[str, Any]) -> None:
    if not sys.stdout.isatty():
        print(json.dumps(view), flush=True)
        return
    print(f"node      {view['node']}")
    active = view["active"]
    print(
        f"active    {active} (epoch {view['epoch']}, {view['route'] or 'no address yet'})"
        if active
        else "active    none"
    )
    named = view["current"]
    print(
        f"current   {', '.join(named) if named is not None else '(never written: the first mate takes over)'}"
    )
    tokens = sorted(set(named or []) | set(view["alive"]) | ({active} if active else set()))
    for token in tokens:
        roles = [r for r, on in (("active", token == active), ("named", token in (named or []))) if on]
        state = "running" if token in view["alive"] else "not running"
        print(f"mate      {token}  {state}  {' '.join(roles)}")


async def _reset(lease: MateLease, view: dict[str, Any], args: argparse.Namespace) -> None:
    named: list[str] | None = view["current"]
    if view["active"] is not None:
        raise CliError(f"mate {view['active']} is active (epoch {view['epoch']}): there is nothing to reset")
    if named is None:
        raise CliError(
            "etcd names no mate yet: the first mate to start takes over; there is nothing to reset"
        )
    running = sorted(set(named) & set(view["alive"]))
    if running:
        raise CliError(
            f"mate {', '.join(running)}, named in current, still runs: it takes over with every "
            "acknowledged event once it can; reset only when every named mate is gone for good"
        )
    loss = (
        f"etcd's current names {', '.join(named)}, none running: whatever they acknowledged that the next "
        "mate's data directory lacks is lost for good (it takes over with what it holds)"
    )
    if not args.yes:
        raise CliError(f"{loss}. Run again with --yes to reset")
    await lease.reset(view["current_revision"])
    print(
        f"reset: {loss}. The first mate of node {args.node} to start (or waiting now) takes over.", flush=True
    )
