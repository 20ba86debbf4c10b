"""``meshplane vpn``: a node's Message VPNs (``ls``, ``show NAME`` from its ``GET /mesh``; user names,
limits and counters, never a password hash), ``check FILE`` (every mistake of a VPN file, with its
line) and ``reload`` (the node reads its file again, as ``SIGHUP``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshplane.cli.errors import EXIT_BAD_INPUT
from meshplane.errors import NotFound


def add_vpn_actions(action: Callable[..., argparse.ArgumentParser]) -> None:
    action("ls", "the Message VPNs of the node at --url: clients, subscriptions, users, refusals")
    p = action("show", "one Message VPN of the node at --url: its users, limits, counters and clients")
    p.add_argument("name", help="the VPN's name")
    p = action(
        "check",
        "check a --mesh-vpns file: one line per mistake, with its line (no server needed)",
        example="meshplane vpn check vpns.toml",
    )
    p.add_argument("file", type=Path, help="a TOML file of [vpns.NAME] sections")
    action(
        "reload",
        "make the node at --url read its VPN file again (as SIGHUP): users, permissions and limits",
    )


def check_file(path: Path) -> int:
    from meshplane.mesh.vpns import check_vpns

    try:
        text = path.read_text()
    except OSError as exc:
        print(f"{path}: cannot read it ({exc.strerror or exc})")
        return EXIT_BAD_INPUT
    vpns, problems = check_vpns(text)
    for problem in problems:
        print(problem.render(path))
    if problems:
        return EXIT_BAD_INPUT
    users = sum(len(vpn.users) for vpn in vpns.values())
    print(f"{path}: {len(vpns)} Message VPN(s) (default included), {users} user(s), no problems")
    return 0


def check_token_file(path: Path, vpns_file: Path | None) -> int:
    """Print every mistake of a streams token file (lines, or TOML for ``*.toml``), a token naming a VPN
    that ``vpns_file`` does not declare among them; the exit status. Tokens are never printed."""
    from meshplane.mesh.vpns import Vpns, check_vpns
    from meshplane.streams.token_file import check_tokens

    try:
        text = path.read_text()
        vpns = check_vpns(vpns_file.read_text())[0] if vpns_file is not None else Vpns()
    except OSError as exc:
        print(f"{exc.filename}: cannot read it ({exc.strerror or exc})")
        return EXIT_BAD_INPUT
    _, problems = check_tokens(text, toml=path.suffix == ".toml", vpns=vpns)
    for problem in problems:
        print(problem.render(path))
    return EXIT_BAD_INPUT if problems else 0


async def run_vpn(args: argparse.Namespace, request: Callable[..., Any]) -> Any:
    """The answer to print for ``args.action`` (``request``: the streams client's)."""
    if args.action == "reload":
        return await request("POST", "/mesh/vpns/reload")
    status = await request("GET", "/mesh")
    vpns: dict[str, dict[str, Any]] = status.get("vpns", {})
    if args.action == "ls":
        return [
            {
                "vpn": name,
                "clients": vpn["clients"],
                "subscriptions": vpn["subscriptions"],
                "users": len(vpn["users"]),
                "logins_refused": vpn["logins_refused"],
                "violations": sum(vpn["violations"].values()),
            }
            for name, vpn in vpns.items()
        ]
    if args.name not in vpns:
        raise NotFound(f"the node has no Message VPN {args.name!r} (it has {', '.join(sorted(vpns))})")
    clients = [
        {key: client.get(key) for key in ("id", "user", "patterns", "delivered", "dropped")}
        for client in status.get("clients", [])
        if client.get("vpn") == args.name
    ]
    return {"vpn": args.name, **vpns[args.name], "connected": clients}
