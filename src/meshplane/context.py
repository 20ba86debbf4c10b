"""Connection contexts, as ``nats context`` has them: the variables a deployment needs, saved under a
name, one of them selected; the library and the CLI read the selected one by default.

A context is the environment variables meshplane reads (``NATS_SERVER``, ``DYN_FILE_KV``,
``MESHPLANE_STREAMS_URL``, ...). Variables set in the process's environment win over it.
Each ``meshplane up`` saves a context of its own (``local``, or ``local-2`` while another live ``up``
holds ``local``), selects it unless another live run holds the selection, and on exit restores what
was selected before; a context whose owner process has exited is not used, and one whose owner
still runs cannot be overwritten or removed by anyone else. ``MESHPLANE_CONTEXT=NAME`` picks one
for a single command (``none``: no context). Files live in ``$XDG_CONFIG_HOME/meshplane/context``
(mode 0600: a context may hold a token).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
from collections import ChainMap
from collections.abc import Iterator, Mapping
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
    "MESHPLANE_STREAMS_VPN",  # the Message VPN an operator's streams commands and Spark queries work in
    "MESHPLANE_MESH_URL",  # a mesh node's HTTP API, for `meshplane mesh ...`
    "MESHPLANE_STATE_DIR",  # a `meshplane up`'s folder, for `meshplane status`
)
SECRETS = ("MESHPLANE_STREAMS_TOKEN",)
DEFAULT_STREAMS_URL = "http://127.0.0.1:15500"
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
    #: What was selected when the owner selected this one: selected again when the owner stops.
    previous: str | None = None

    def is_live(self) -> bool:
        return self.owner_pid is None or process_alive(self.owner_pid)

    def held_by_another_run(self) -> bool:
        """It belongs to another process that still runs: only that process may replace or remove it."""
        return self.owner_pid is not None and self.owner_pid != os.getpid() and self.is_live()

    def shown(self) -> dict[str, str]:
        """The values with secrets hidden and credentials cut out of URLs."""
        return {k: ("***" if k in SECRETS else _without_userinfo(v)) for k, v in self.values.items()}


def process_alive(pid: int) -> bool:
    if pid <= 0:  # 0 and -1 would ask about process groups
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def _without_userinfo(value: str) -> str:
    return re.sub(r"(://)[^/@]*@", r"\1***@", value)


def check_name(name: str) -> str:
    if not _NAME.match(name) or name == "none":
        raise ConfigError(f"context name {name!r} must be letters, digits, '_', '.' or '-' (not 'none')")
    return name


def _path(name: str) -> Path:
    return contexts_dir() / f"{check_name(name)}.json"


def _refuse_if_held(name: str, doing: str) -> None:
    if not _path(name).exists():
        return
    try:
        existing = load(name)
    except ConfigError:  # an unreadable file may be replaced or removed
        return
    if existing.held_by_another_run():
        raise ConfigError(
            f"cannot {doing} context {name!r}: it belongs to a running process "
            f"(pid {existing.owner_pid}, {existing.description or 'meshplane up'}); "
            "it goes when that stops"
        )


def save(context: Context) -> Path:
    unknown = sorted(set(context.values) - set(VARIABLES))
    if unknown:
        raise ConfigError(f"a context holds only {', '.join(VARIABLES)}; not {', '.join(unknown)}")
    _refuse_if_held(context.name, "replace")
    path = _path(context.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "values": context.values,
        "description": context.description,
        "owner_pid": context.owner_pid,
        "previous": context.previous,
    }
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
        previous = body.get("previous")
        description = str(body.get("description", ""))
        return Context(
            name, values, description, int(owner) if owner else None, str(previous) if previous else None
        )
    except FileNotFoundError:
        raise ConfigError(f"no context named {name!r} (meshplane context ls)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"context file {path} is unreadable ({exc}); fix it or remove it") from None


def names() -> list[str]:
    folder = contexts_dir()
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def remove(name: str) -> None:
    _refuse_if_held(name, "remove")
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


@contextlib.contextmanager
def _exclusive() -> Iterator[None]:
    """Runs that start or stop at once take turns choosing names and the selection."""
    folder = contexts_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _selection_file() -> str | None:
    try:
        return (contexts_dir() / "selected").read_text().strip() or None
    except OSError:
        return None


def _live(name: str) -> Context | None:
    with contextlib.suppress(ConfigError):
        found = load(name)
        if found.is_live():
            return found
    return None


def claim_for_run(base: str, values: dict[str, str], description: str) -> tuple[str, bool]:
    """Save this process's context under ``base`` (``base-2``, ... while a live run holds it) and
    select it unless another live run holds the selection. Returns the name and whether it is selected."""
    check_name(base)
    with _exclusive():
        name, number = base, 1
        while True:
            existing = _live(name) if _path(name).exists() else None
            if existing is None or not existing.held_by_another_run():
                break
            number += 1
            name = f"{base}-{number}"
        previous = _selection_file()
        holder = _live(previous) if previous is not None else None
        take = holder is None or not holder.held_by_another_run()
        kept = previous if take and previous != name else None
        save(Context(name, values, description, owner_pid=os.getpid(), previous=kept))
        if take:
            select(name)
    return name, take


def release_run(name: str) -> None:
    """Remove this process's context; if it is selected, select what was before it (while that still
    exists and lives), else another live run's, else nothing."""
    with _exclusive():
        try:
            mine = load(name)
        except ConfigError:
            return
        if mine.owner_pid != os.getpid():
            return
        _path(name).unlink(missing_ok=True)
        if _selection_file() != name:
            return
        candidates = [mine.previous] if mine.previous else []
        candidates += [other for other in names() if (found := _live(other)) and found.owner_pid is not None]
        for candidate in candidates:
            if candidate != name and _path(candidate).exists() and _live(candidate) is not None:
                select(candidate)
                return
        select(None)


def selected_name() -> str | None:
    chosen = os.environ.get("MESHPLANE_CONTEXT")
    if chosen is not None:
        return None if chosen in ("", "none") else chosen
    return _selection_file()


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


def streams_endpoint() -> tuple[str, str | None]:
    """The streams server the CLI uses and its token: ``$MESHPLANE_STREAMS_URL`` and
    ``$MESHPLANE_STREAMS_TOKEN``, else the selected context's (``meshplane up``'s), else
    ``http://127.0.0.1:15500`` without a token. What every client and example starts from."""
    env = environment()
    return env.get("MESHPLANE_STREAMS_URL") or DEFAULT_STREAMS_URL, env.get("MESHPLANE_STREAMS_TOKEN") or None
