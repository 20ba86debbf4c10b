"""Which registered publishers a ``meshplane sub SCOPE TOPIC`` reaches, and the near misses. Pure.

A subscriber hears the publishers of its exact scope. ``ls`` lists everything under a scope, so
``sub`` does the same: given ``ns/component`` and no publisher there, it follows the topic in every
endpoint below. When nothing matches, the message names what does exist (a typo in the topic or
the scope shows at once instead of a silent wait).
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from meshplane.core.names import Scope
from meshplane.core.records import EventChannel


def is_under(scope: Scope, inner: Scope) -> bool:
    """``inner`` is ``scope`` or lies below it (a component of the namespace, an endpoint of it)."""
    return (
        inner.namespace_name == scope.namespace_name
        and scope.component_name in (None, inner.component_name)
        and scope.endpoint_name in (None, inner.endpoint_name)
    )


@dataclass(frozen=True)
class PublisherMatch:
    scope: Scope
    topic: str
    #: Scopes to subscribe in, with their publishers of the topic: the scope itself when it has
    #: any, else every scope below it that has.
    reached: dict[Scope, int]
    #: Topics published under the scope, by publishers (for "did you mean").
    topics_here: Counter[str]
    #: Scopes anywhere publishing the topic, by publishers.
    scopes_with_topic: Counter[Scope]

    @property
    def publishers(self) -> int:
        return sum(self.reached.values())

    def describe(self) -> str:
        """One line: what is reached, or why nothing is and what is near."""
        if self.reached:
            where = ", ".join(f"{s} ({n})" for s, n in sorted(self.reached.items(), key=lambda i: str(i[0])))
            return f"{self.topic}: {self.publishers} publisher(s) in {where}"
        hints = []
        close_topics = difflib.get_close_matches(self.topic, list(self.topics_here), n=3)
        if close_topics:
            hints.append("did you mean topic " + " or ".join(close_topics) + "?")
        elif self.topics_here:
            hints.append("topics there: " + ", ".join(sorted(self.topics_here)[:8]))
        if self.scopes_with_topic:
            scopes = sorted(str(s) for s in self.scopes_with_topic)
            hints.append(f"{self.topic} is published in " + ", ".join(scopes[:5]))
        hint = "; ".join(hints) if hints else "nothing is registered there yet"
        return f"no publisher of {self.topic} in {self.scope} or below; {hint}"


def match_publishers(scope: Scope, topic: str, channels: Iterable[EventChannel]) -> PublisherMatch:
    by_scope: Counter[Scope] = Counter()
    topics_here: Counter[str] = Counter()
    for channel in channels:
        if channel.topic == topic:
            by_scope[channel.scope] += 1
        if is_under(scope, channel.scope):
            topics_here[channel.topic] += 1
    if by_scope[scope]:
        reached = {scope: by_scope[scope]}
    else:
        reached = {s: n for s, n in by_scope.items() if is_under(scope, s)}
    return PublisherMatch(scope, topic, reached, topics_here, by_scope)
