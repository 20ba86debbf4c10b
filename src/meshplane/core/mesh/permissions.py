"""A mesh user's publish and subscribe permissions (nats-server's ``permissions``), sans I/O.

Each direction has ``allow`` and ``deny`` patterns; deny wins, and an empty ``allow`` allows all.

- **Publish** on a subject: some ``allow`` pattern matches it (or there is none) and no ``deny`` does.
- **Subscribe** to a pattern: some ``allow`` pattern covers it (every subject it matches, as
  nats-server matches a subscription's subject against ``allow``: ``orders.>`` covers ``orders.*``,
  ``orders.eu`` does not) and it could match no denied subject (no ``deny`` pattern intersects it).
  nats-server takes such a subscription and filters what it delivers; the mesh refuses it instead, so
  a delivery never pays for a check.

Both tests compare two patterns token by token (:func:`covers`, :func:`intersects`): linear in their
length, whatever the patterns are; a user's check is linear in the size of its permissions. Decisions
are remembered per subject (bounded), since subjects repeat.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplane.core.mesh.queue_permissions import ACTIONS, QueueRules
from meshplane.core.subjects import ANY, MAX_TOKENS, ONE, REST, pattern_shape, valid_pattern


def _lengths(fixed: list[str], tail: str) -> tuple[int, int]:
    """The fewest and most tokens a subject the pattern matches has (a subject has one at least)."""
    if tail == REST:
        return len(fixed) + 1, MAX_TOKENS
    if tail == ANY:
        return max(1, len(fixed)), MAX_TOKENS
    return len(fixed), len(fixed)


def intersects(a: str, b: str) -> bool:
    """Whether some subject matches both patterns."""
    fixed_a, tail_a = pattern_shape(a)
    fixed_b, tail_b = pattern_shape(b)
    low_a, high_a = _lengths(fixed_a, tail_a)
    low_b, high_b = _lengths(fixed_b, tail_b)
    if max(low_a, low_b) > min(high_a, high_b):
        return False
    # Beyond the shorter fixed part, a tail wildcard takes whatever the other names.
    return all(x == y or ONE in (x, y) for x, y in zip(fixed_a, fixed_b, strict=False))


def covers(outer: str, inner: str) -> bool:
    """Whether every subject ``inner`` matches, ``outer`` matches too."""
    fixed_o, tail_o = pattern_shape(outer)
    fixed_i, tail_i = pattern_shape(inner)
    low_o, high_o = _lengths(fixed_o, tail_o)
    low_i, high_i = _lengths(fixed_i, tail_i)
    if low_i < low_o or high_i > high_o:
        return False
    for position, token in enumerate(fixed_o):
        # Where ``inner`` names a word, ``outer`` must name it or take any; where ``inner`` takes any
        # (its '*', or its tail), ``outer`` must take any too.
        theirs = fixed_i[position] if position < len(fixed_i) else ONE
        if token != ONE and token != theirs:
            return False
    return True


@dataclass(frozen=True)
class Rules:
    """One direction's patterns."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for pattern in (*self.allow, *self.deny):
            if valid_pattern(pattern) is None:
                raise ValueError(f"{pattern[:80]!r} is not a valid pattern")


DENIED = "permission denied: "  # how every refusal's reason starts (a client raises PermissionDenied)
DECISIONS = 4096  # subjects whose publish decision is remembered, per user


@dataclass
class Permissions:
    """What one user may publish and subscribe to, and do with queues."""

    publish: Rules = field(default_factory=Rules)
    subscribe: Rules = field(default_factory=Rules)
    queues: QueueRules = field(default_factory=QueueRules)
    _decided: dict[str, str] = field(default_factory=dict, repr=False)

    def why_not_publish(self, subject: str) -> str:
        """ "" when ``subject`` may be published on, else the reason (one line)."""
        known = self._decided.get(subject)
        if known is not None:
            return known
        rules = self.publish
        reason = ""
        denied = next((p for p in rules.deny if intersects(p, subject)), None)
        if denied is not None:
            reason = f"{DENIED}publish to {subject[:80]!r} denied by {denied!r}"
        elif rules.allow and not any(intersects(p, subject) for p in rules.allow):
            reason = f"{DENIED}publish to {subject[:80]!r} not allowed"
        if len(self._decided) >= DECISIONS:
            self._decided.clear()
        self._decided[subject] = reason
        return reason

    def why_not_subscribe(self, pattern: str) -> str:
        """ "" when ``pattern`` may be subscribed to, else the reason (one line)."""
        rules = self.subscribe
        denied = next((p for p in rules.deny if intersects(p, pattern)), None)
        if denied is not None:
            return f"{DENIED}subscription to {pattern[:80]!r} could match subjects denied by {denied!r}"
        if rules.allow and not any(covers(p, pattern) for p in rules.allow):
            return f"{DENIED}subscription to {pattern[:80]!r} not allowed"
        return ""

    def why_not_queue(self, action: str, name: str, patterns: tuple[str, ...] = ()) -> str:
        """ "" when ``action`` (create, bind, read) on the queue ``name`` (its name in its VPN) is
        allowed, else the reason (one line). Binding ``patterns`` needs each to be one the user may
        subscribe to as well: a queue would otherwise keep for it what its subscriptions may not get."""
        assert action in ACTIONS
        reason = self.queues.why_not(action, name)
        if reason:
            return DENIED + reason
        for pattern in patterns if action == "bind" else ():
            refused = self.why_not_subscribe(pattern)
            if refused:
                return f"{DENIED}bind queue {name[:80]!r}: {refused[len(DENIED) :]}"
        return ""
