"""What the dashboard shows, computed without I/O: trends of sampled counters, readable payloads, the
scope tree of registered publishers, and a time search over offsets."""

from __future__ import annotations

import base64
import json
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec

from meshplane.core.records import EventChannel

# --- trends ----------------------------------------------------------------------------------------


class Trends:
    """Named series of (time, value) points over the last ``span`` samples, at most ``max_series``.

    A series absent from a sample ends (a deleted topic or group), so the table stays as large as
    what exists, and each series as long as the span.
    """

    def __init__(self, span: int = 300, max_series: int = 2000) -> None:
        self.span, self.max_series = span, max_series
        self.series: dict[str, deque[tuple[float, float]]] = {}
        self._last_counters: dict[str, int] = {}
        self._last_at: float | None = None

    def rates(self, now: float, counters: Mapping[str, int]) -> dict[str, float]:
        """Per-second rates of monotonic counters since the previous call (0 on the first one, and
        for a counter that went back, as after a topic was deleted and made again)."""
        elapsed = None if self._last_at is None else now - self._last_at
        rates = {}
        for name, value in counters.items():
            previous = self._last_counters.get(name)
            if elapsed is None or previous is None or elapsed <= 0 or value < previous:
                rates[name] = 0.0
            else:
                rates[name] = (value - previous) / elapsed
        self._last_counters, self._last_at = dict(counters), now
        return rates

    def record(self, now: float, values: Mapping[str, float]) -> None:
        for name in [n for n in self.series if n not in values]:
            del self.series[name]
        for name, value in values.items():
            points = self.series.get(name)
            if points is None:
                if len(self.series) >= self.max_series:
                    continue
                points = self.series[name] = deque(maxlen=self.span)
            points.append((now, value))

    def export(self, names: Iterable[str] | None = None) -> dict[str, list[tuple[float, float]]]:
        wanted = self.series if names is None else names
        return {name: list(self.series[name]) for name in wanted if name in self.series}


# --- payloads --------------------------------------------------------------------------------------

PREVIEW_BYTES = 4096


def readable(data: Any) -> dict[str, Any]:
    """An event's data for people: JSON as it is; bytes as the MessagePack they hold, else UTF-8
    text, else a hex dump (``format`` says which; ``truncated`` when only the start is shown)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        return {"format": "json", "value": _jsonable(data)}
    raw = bytes(data)
    if raw:
        try:
            decoded = msgspec.msgpack.decode(raw)
        except (msgspec.DecodeError, ValueError):
            pass
        else:
            if isinstance(decoded, dict | list):  # a lone small int or string is likelier text or bytes
                return {"format": "msgpack", "value": _jsonable(decoded), "size": len(raw)}
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return {"format": "binary", "value": hexdump(raw[:PREVIEW_BYTES]), "size": len(raw)} | (
            {"truncated": True} if len(raw) > PREVIEW_BYTES else {}
        )
    return {"format": "text", "value": text[:PREVIEW_BYTES], "size": len(raw)} | (
        {"truncated": True} if len(text) > PREVIEW_BYTES else {}
    )


def _jsonable(value: Any) -> Any:
    """Nested bytes (as MessagePack bin) as ``{"base64": ...}``; map keys as strings."""
    if isinstance(value, bytes | bytearray | memoryview):
        return {"base64": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, dict):
        return {k if isinstance(k, str) else json.dumps(_jsonable(k)): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, msgspec.msgpack.Ext):
        return {"ext": value.code, "base64": base64.b64encode(value.data).decode()}
    return value


def hexdump(raw: bytes, width: int = 16) -> str:
    """``offset  hex bytes  |printable|`` lines, as ``hexdump -C`` prints them."""
    lines = []
    for at in range(0, len(raw), width):
        chunk = raw[at : at + width]
        shown = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{at:08x}  {chunk.hex(' '):<{width * 3 - 1}}  |{shown}|")
    return "\n".join(lines)


# --- time search -----------------------------------------------------------------------------------


def first_at_or_after(start: int, end: int, stamp_of: Callable[[int], int], timestamp_ms: int) -> int:
    """The first offset in [start, end) whose stamp is at or after ``timestamp_ms`` (``end`` when
    none is), for logs whose stamps never decrease: a binary search, log2(end - start) reads."""
    low, high = start, end
    while low < high:
        middle = (low + high) // 2
        if stamp_of(middle) < timestamp_ms:
            low = middle + 1
        else:
            high = middle
    return low


# --- the event plane -------------------------------------------------------------------------------


def scope_tree(channels: Iterable[EventChannel]) -> list[dict[str, Any]]:
    """Registered publishers as namespace / component / endpoint / topic, sorted by name.

    Each node is ``{"name", "kind", "children"}``; a topic node lists its ``publishers``.
    """
    root: dict[tuple[str, str], dict[str, Any]] = {}
    for channel in channels:
        scope = channel.scope
        path = [("namespace", scope.namespace_name)]
        if scope.component_name is not None:
            path.append(("component", scope.component_name))
        if scope.endpoint_name is not None:
            path.append(("endpoint", scope.endpoint_name))
        level = root
        for kind, name in path:
            node = level.setdefault((kind, name), {"name": name, "kind": kind, "children": {}})
            level = node["children"]
        topic = level.setdefault(
            ("topic", channel.topic),
            {"name": channel.topic, "kind": "topic", "children": {}, "publishers": []},
        )
        config = channel.transport_config
        topic["publishers"].append(
            {
                "instance_id": f"{channel.instance_id:x}",
                "transport": channel.transport_kind,
                "address": config.get("endpoint") or config.get("subject_prefix") or "",
            }
        )
    return _sorted_nodes(root)


def _sorted_nodes(level: dict[tuple[str, str], dict[str, Any]]) -> list[dict[str, Any]]:
    nodes = []
    for key in sorted(level):
        node = dict(level[key])
        node["children"] = _sorted_nodes(node["children"])
        if "publishers" in node:
            node["publishers"] = sorted(node["publishers"], key=lambda p: p["instance_id"])
        nodes.append(node)
    return nodes
