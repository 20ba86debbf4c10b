"""MQTT topic names and filters as mesh subjects and patterns, and back (sans I/O).

``a/b/c`` is the subject ``a.b.c``; in filters ``+`` is ``*`` and a last ``#`` is the mesh's ``#``
(zero or more levels: ``a/#`` matches ``a`` too, as MQTT wants). What cannot map is refused, never
guessed: a level holding ``.`` (the mesh's separator), an empty level (``a//b``, a leading or
trailing ``/``), a ``$`` topic or filter (``$SYS``, ``$share/...``: the mesh reserves ``$`` for its
own subjects), a level that is a mesh wildcard (``*``, ``>``), a wildcard inside a level (``a+``),
and anything the mesh's subject rules refuse (spaces, control characters, more than 32 levels or
1024 bytes). A mesh subject's tokens become levels as they are: one holding ``/`` reaches MQTT
subscribers as more levels than it had.

A shared subscription's filter, ``$share/{ShareName}/{filter}`` (MQTT 5 section 4.8.2; mosquitto
takes it from 3.1.1 clients too), is split by :func:`shared` into its group and its filter.
"""

from __future__ import annotations

from meshplane.core.doors.nats_groups import InvalidGroup, check_group
from meshplane.core.subjects import ANY, ONE, REST, InvalidSubject, validate

SHARE = "$share/"
RETAIN_PREFIX = "$mqtt."  # the subject a retained message travels on to the other nodes


class BadTopic(ValueError):
    """An MQTT topic name or filter that has no mesh subject or pattern; the text says why."""


def _levels(text: str, what: str) -> list[str]:
    if not text:
        raise BadTopic(f"an empty {what}")
    if text.startswith("$"):
        raise BadTopic(f"{what} {text[:80]!r}: '$' topics are reserved on the mesh")
    levels = text.split("/")
    for level in levels:
        if not level:
            raise BadTopic(f"{what} {text[:80]!r} has an empty level (the mesh has no empty tokens)")
        if "." in level:
            raise BadTopic(f"{what} {text[:80]!r}: '.' separates the mesh's tokens, not allowed in a level")
        if level in (ONE, REST):
            raise BadTopic(f"{what} {text[:80]!r}: the level {level!r} is a mesh wildcard")
    return levels


def shared(topic_filter: str) -> tuple[str, str] | None:
    """``(group, filter)`` of a shared subscription's filter, None for any other filter; BadTopic when
    it breaks MQTT's rules (a share name empty or holding ``/``, ``+``, ``#``; no filter after it) or
    names a group the mesh cannot carry in one token."""
    if not topic_filter.startswith(SHARE):
        return None
    group, slash, rest = topic_filter[len(SHARE) :].partition("/")
    if not slash or not rest:
        raise BadTopic(f"shared filter {topic_filter[:80]!r}: '$share/' takes a share name, '/', a filter")
    if not group or "+" in group or "#" in group:
        raise BadTopic(f"shared filter {topic_filter[:80]!r}: a share name is not empty, without '+' or '#'")
    try:
        return check_group(group), rest
    except InvalidGroup as exc:
        raise BadTopic(str(exc)) from None


def to_subject(topic: str) -> str:
    """An MQTT topic name (of a PUBLISH, a will) as a mesh subject; BadTopic if it has none."""
    levels = _levels(topic, "topic")
    if any("+" in level or "#" in level for level in levels):
        raise BadTopic(f"topic {topic[:80]!r}: wildcards belong in filters, not in a PUBLISH's topic")
    return _checked(".".join(levels), wildcards=False)


def to_pattern(topic_filter: str) -> str:
    """An MQTT topic filter as a mesh pattern; BadTopic if it has none."""
    levels = _levels(topic_filter, "filter")
    last = len(levels) - 1
    mapped = []
    for index, level in enumerate(levels):
        if level == "+":
            mapped.append(ONE)
        elif level == "#":
            if index != last:
                raise BadTopic(f"filter {topic_filter[:80]!r}: '#' may only be the last level")
            mapped.append(ANY)
        elif "+" in level or "#" in level:
            raise BadTopic(f"filter {topic_filter[:80]!r}: a wildcard must be a whole level")
        else:
            mapped.append(level)
    return _checked(".".join(mapped), wildcards=True)


def _checked(subject: str, wildcards: bool) -> str:
    try:
        return validate(subject, wildcards=wildcards)
    except InvalidSubject as exc:
        raise BadTopic(str(exc)) from None


def to_topic(subject: str) -> str:
    """A mesh subject as the MQTT topic its subscribers see."""
    return subject.replace(".", "/")


def matches(pattern: str, subject: str) -> bool:
    """Whether a mesh ``pattern`` (as :func:`to_pattern` makes them) matches ``subject`` (for the QoS of
    overlapping subscriptions; the node's index does the routing)."""
    words, tokens = pattern.split("."), subject.split(".")
    for index, word in enumerate(words):
        if word in (ONE, ANY, REST) and _reserved_here(tokens, index):
            return False  # a wildcard never matches a leading '$' token (the mesh's rule)
        if word == ANY:
            return True
        if word == REST:
            return len(tokens) > index
        if index >= len(tokens) or (word != ONE and word != tokens[index]):
            return False
    return len(words) == len(tokens)


def _reserved_here(tokens: list[str], index: int) -> bool:
    return index < len(tokens) and all(token.startswith("$") for token in tokens[: index + 1])
