"""Connection contexts, as ``nats context`` has them: the variables a deployment needs, saved under a
name, one of them selected; the library and the CLI read the selected one by default.

A context is the environment variables meshplane reads (``NATS_SERVER``, ``DYN_FILE_KV``,
``MESHPLANE_STREAMS_URL``, ...). Variables set in the process's environment win over it.
``meshplane up`` saves and selects the context ``local`` while it runs; a context whose owner
process has exited is not used. ``MESHPLANE_CONTEXT=NAME`` picks one for a single command
(``none``: no context). Files live in ``$XDG_CONFIG_HOME/meshplane/context`` (mode 0600: a
context may hold a token).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from meshplane.errors import ConfigError

log = logging.getLogger(__name__)

#: What a context may set; the rest of the environment is the process's own business.
VARIABLES = (
    "DYN_EVENT_PLANE",
    "NATS_SERVER",
    "DYN_DISCOVERY_BACKEND",
    "DYN_FILE_KV",
    "ETCD_ENDPOINTS",
    "DYN_ZMQ_BROKER_URL",
    "DYN_ZMQ_BROKER_ENABLED",
    "MESHPLANE_NODE",
    "MESHPLANE_GUARANTEED",
    "MESHPLANE_STREAMS_URL",
    "MESHPLANE_STREAMS_TOKEN",
)
SECRETS = ("MESHPLANE_STREAMS_TOKEN",)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def contexts_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "meshplane" / "context"


@dataclass(frozen=True)
class Context:
    name: str
    values: dict[str, str] = field(default_factory=dict)
    description: str = ""
    #: The process the context belongs to (``meshplane up``); None: it lasts until removed.
    owner_pid: int | None = None

    def is_live(self) -> bool:
        if self.owner_pid is None:
            return True
        try:
            os.kill(self.owner_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # someone else's process: it exists
            return True
        return True

    def shown(self) -> dict[str, str]:
        """The values with secrets hidden and credentials cut out of URLs."""
        return {k: ("***" if k in SECRETS else _without_userinfo(v)) for k, v in self.values.items()}


def _without_userinfo(value: str) -> str:
    return re.sub(r"(://)[^/@]*@", r"\1***@", value)


def check_name(name: str) -> str:
    if not _NAME.match(name) or name == "none":
        raise ConfigError(f"context name {name!r} must be letters, digits, '_', '.' or '-' (not 'none')")
    return name


def _path(name: str) -> Path:
    return contexts_dir() / f"{check_name(name)}.json"


def save(context: Context) -> Path:
    unknown = sorted(set(context.values) - set(VARIABLES))
    if unknown:
        raise ConfigError(f"a context holds only {', '.join(VARIABLES)}; not {', '.join(unknown)}")
    path = _path(context.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"values": context.values, "description": context.description, "owner_pid": context.owner_pid}
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(body, out, indent=2)
    os.replace(temporary, path)
    return path


def load(name: str) -> Context:
    path = _path(name)
    try:
        body = json.loads(path.read_text())
        values = {str(k): str(v) for k, v in dict(body["values"]).items() if k in VARIABLES}
        owner = body.get("owner_pid")
        return Context(name, values, str(body.get("description", "")), int(owner) if owner else None)
    except FileNotFoundError:
        raise ConfigError(f"no context named {name!r} (meshplane context ls)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"context file {path} is unreadable ({exc}); fix it or remove it") from None


def names() -> list[str]:
    folder = contexts_dir()
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def remove(name: str) -> None:
    _path(name).unlink(missing_ok=True)
    if selected_name() == name:
        (contexts_dir() / "selected").unlink(missing_ok=True)


def select(name: str | None) -> None:
    """Make ``name`` the default (None: no default)."""
    marker = contexts_dir() / "selected"
    if name is None:
        marker.unlink(missing_ok=True)
        return
    load(name)  # it must exist
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(name + "\n")


def selected_name() -> str | None:
    chosen = os.environ.get("MESHPLANE_CONTEXT")
    if chosen is not None:
        return None if chosen in ("", "none") else chosen
    try:
        return (contexts_dir() / "selected").read_text().strip() or None
    except OSError:
        return None


def current() -> Context | None:
    """The selected context, when there is one and its owner still runs."""
    name = selected_name()
    if name is None:
        return None
    if not _path(name).exists():  # removed by hand: the selection points at nothing
        log.warning("the selected context %r does not exist (meshplane context select NAME|none)", name)
        return None
    context = load(name)
    if not context.is_live():
        log.warning(
            "context %r belonged to a process that has stopped (pid %s); not using it",
            name,
            context.owner_pid,
        )
        return None
    return context


def environment() -> Mapping[str, str]:
    """The process's environment over the selected context's values."""
    context = current()
    return ChainMap(dict(os.environ), context.values) if context is not None else os.environ
