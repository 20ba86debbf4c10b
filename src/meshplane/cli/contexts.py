"""``meshplane context ...`` and ``meshplane env``: save, select and show connection contexts."""

from __future__ import annotations

import argparse
import os
import shlex
from typing import Any

from meshplane import context
from meshplane.cli.errors import CliError


def add_context_commands(commands: Any) -> None:
    ctx = commands.add_parser(
        "context",
        help="save, select and show connection contexts (what `up` writes; like `nats context`)",
        description="A context holds the variables a deployment needs (NATS_SERVER, DYN_FILE_KV, "
        "MESHPLANE_STREAMS_URL, ...); the selected one is read by every command and by the library. "
        "Variables set in the environment win. MESHPLANE_CONTEXT=NAME picks one for one command.",
    )
    actions = ctx.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("ls", help="list the contexts: * marks the selected one; a run's says if it runs")
    show = actions.add_parser("show", help="print a context (secrets hidden)")
    show.add_argument("name", nargs="?", help="default: the selected one")
    save = actions.add_parser(
        "save",
        help="save the meshplane variables of this environment as a context",
        description="Save the meshplane variables set in this shell ("
        + ", ".join(context.VARIABLES)
        + ") under NAME.",
    )
    save.add_argument("name", help="context name: letters, digits, '_', '.', '-'")
    save.add_argument("--description", default="", help="a line that says what it points at")
    save.add_argument("--select", action="store_true", help="also make it the selected context")
    select = actions.add_parser("select", help="make NAME the context every command reads")
    select.add_argument("name", help="a context name, or none for no context")
    rm = actions.add_parser("rm", help="remove a context")
    rm.add_argument("name", help="context name")

    env = commands.add_parser(
        "env",
        help="print the selected context as shell exports",
        description='Print the selected context as `export` lines, for `eval "$(meshplane env)"`. '
        "Secrets are left out unless --show-secrets.",
    )
    env.add_argument("name", nargs="?", help="default: the selected one")
    env.add_argument("--show-secrets", action="store_true", help="include tokens")


def _chosen(name: str | None) -> context.Context:
    chosen = name or context.selected_name()
    if chosen is None:
        raise CliError("no context is selected (meshplane context ls, meshplane context select NAME)")
    return context.load(chosen)


def run_context(args: argparse.Namespace) -> int:
    if args.command == "env":
        found = _chosen(args.name)
        for key, value in sorted(found.values.items()):
            if key in context.SECRETS and not args.show_secrets:
                continue
            print(f"export {key}={shlex.quote(value)}")
        return 0
    if args.action == "ls":
        selected = context.selected_name()
        for name in context.names():
            found = context.load(name)
            if found.owner_pid is None:
                state = "saved"
            else:
                state = f"live (pid {found.owner_pid})" if found.is_live() else "stopped"
            print(f"{'*' if name == selected else ' '} {name:<20} {state:<18} {found.description}".rstrip())
    elif args.action == "show":
        found = _chosen(args.name)
        print(f"context {found.name}: {found.description}")
        for key, value in sorted(found.shown().items()):
            print(f"  {key}={value}")
    elif args.action == "save":
        values = {k: os.environ[k] for k in context.VARIABLES if os.environ.get(k)}
        if not values:
            raise CliError(
                f"none of {', '.join(context.VARIABLES)} is set in this environment: nothing to save"
            )
        path = context.save(context.Context(args.name, values, args.description))
        if args.select:
            context.select(args.name)
        print(f"saved context {args.name} ({', '.join(sorted(values))}) in {path}")
    elif args.action == "select":
        context.select(None if args.name == "none" else args.name)
    else:
        context.remove(args.name)
    return 0
