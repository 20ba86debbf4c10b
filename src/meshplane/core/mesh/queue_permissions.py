"""Who may create, bind and read a Message VPN's guaranteed queues, by queue name, sans I/O.

A user's ``queues`` permissions have three actions, each with ``allow`` and ``deny`` patterns of queue
names, as its publish and subscribe permissions have of subjects: deny wins, no ``allow`` allows all.

- **create**: make a queue that does not exist yet (its first patterns are bound with it: ``bind``
  is checked too);
- **bind**: give a queue its patterns (the subjects it takes guaranteed events on), at its creation
  or later; each pattern must also be one the user may subscribe to, or a queue would read for it
  what its subscribe permissions refuse;
- **read**: consume what a queue stored.

A queue name is one token (no ``.``, ``*`` or ``>``: it is a topic's name), so its patterns are
names in which ``*`` stands for any run of characters: ``orders-*`` matches ``orders-eu`` and
``orders-``, ``*`` every name, ``mqtt-*`` the queues of the MQTT door's persistent sessions. A
check is linear in the name and the patterns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ACTIONS = ("create", "bind", "read")
_FORBIDDEN = re.compile(r"[\s.>/\\\x00-\x1f\x7f]")  # what a queue name cannot hold (core/names.py)


def check_name_pattern(pattern: str) -> str:
    """``pattern`` if it can match queue names (1-255 bytes, no ``.``, ``>``, ``/``, ``\\``,
    whitespace or control characters); else ValueError."""
    if not pattern or len(pattern.encode()) > 255 or _FORBIDDEN.search(pattern):
        raise ValueError(
            f"{pattern[:80]!r} is not a queue name pattern (a queue's name, '*' standing for any characters)"
        )
    return pattern


def name_matches(pattern: str, name: str) -> bool:
    """Whether ``name`` matches ``pattern`` (``*``: any run of characters, the empty one too)."""
    parts = pattern.split("*")
    if len(parts) == 1:
        return pattern == name
    first, *middle, last = parts
    if len(name) < len(first) + len(last) or not name.startswith(first) or not name.endswith(last):
        return False
    at, end = len(first), len(name) - len(last)
    for part in middle:  # each as early as it fits leaves the most room for the rest
        found = name.find(part, at, end)
        if found < 0:
            return False
        at = found + len(part)
    return True


@dataclass(frozen=True)
class NameRules:
    """One action's patterns of queue names."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for pattern in (*self.allow, *self.deny):
            check_name_pattern(pattern)

    def why_not(self, action: str, name: str) -> str:
        """ "" when ``action`` on the queue ``name`` is allowed, else why not (one line, to follow
        :data:`~meshplane.core.mesh.permissions.DENIED`)."""
        denied = next((p for p in self.deny if name_matches(p, name)), None)
        if denied is not None:
            return f"{action} queue {name[:80]!r} denied by {denied!r}"
        if self.allow and not any(name_matches(p, name) for p in self.allow):
            return f"{action} queue {name[:80]!r} not allowed"
        return ""


@dataclass(frozen=True)
class QueueRules:
    """A user's queue permissions: ``create``, ``bind`` and ``read``."""

    create: NameRules = field(default_factory=NameRules)
    bind: NameRules = field(default_factory=NameRules)
    read: NameRules = field(default_factory=NameRules)

    def why_not(self, action: str, name: str) -> str:
        """Why ``action`` (one of :data:`ACTIONS`) on the queue ``name`` is refused, or ""."""
        rules: NameRules = getattr(self, action)
        return rules.why_not(action, name)
