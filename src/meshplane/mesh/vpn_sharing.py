"""Exports and imports of a VPN file (``[vpns.NAME] exports = [...]``, ``imports = [...]``), checked:

```toml
[vpns.team-a]
exports = [{ events = "orders.>" }, { events = "pay.>", to = ["team-b"] }]  # to: only these may import
[vpns.team-b]
imports = [{ vpn = "team-a", events = "orders.eu.>", prefix = "a" }]  # seen here as a.orders.eu.>
```

A mistake is said with the line of the export or import it is in: a pattern that is none (or names a
reserved ``$`` subject), a prefix with a wildcard, an import of a VPN that does not exist or of a space
that VPN does not export to it, two imports of one VPN whose spaces (after their prefixes) overlap
(an event would come twice), and an export of a space the VPN imports (imports are not passed on:
exporting one again would make chains and cycles of VPNs; import from the exporter itself).
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from meshplane.core.mesh.imports import Export, Import, exported, intersect
from meshplane.core.mesh.permissions import intersects
from meshplane.core.subjects import is_reserved, valid_pattern

SHARING = ("exports", "imports")


class Report(Protocol):
    def add(self, path: tuple[str, ...], where: str, message: str, line: int | None = None) -> None: ...


def element_lines(text: str, line: int, count: int) -> list[int]:
    """The lines of the first ``count`` inline tables of an array whose key is on ``line``: the
    ``{`` that opens each, counted from there (a table past the text's end: the key's line)."""
    found: list[int] = []
    for number, content in enumerate(text.splitlines()[line - 1 :], line):
        found += [number] * len(re.findall(r"\{", content.split("#", 1)[0] if "{" in content else ""))
        if len(found) >= count:
            break
    return (found + [line] * count)[:count]


Numbered = tuple[tuple[tuple[int, Export], ...], tuple[tuple[int, Import], ...]]


def parse_sharing(
    report: Report, path: tuple[str, ...], where: str, settings: dict[str, Any], lines: dict[str, list[int]]
) -> Numbered:
    """A VPN's exports and imports as written, each with its index (what cannot be read is reported
    and left out); ``lines`` gives each element's line, by key."""
    exports: list[tuple[int, Export]] = []
    imports: list[tuple[int, Import]] = []
    for key in SHARING:
        given = settings.get(key, [])
        if not isinstance(given, list) or not all(isinstance(e, dict) for e in given):
            report.add((*path, key), where, f"{key} must be a list of tables ({key} = [{{ ... }}])")
            continue
        for number, entry in enumerate(given):
            made = _export(entry) if key == "exports" else _import(entry)
            if isinstance(made, str):
                report.add((*path, key), f"{where} {key}[{number}]", made, _line(lines, key, number))
            elif isinstance(made, Export):
                exports.append((number, made))
            else:
                imports.append((number, made))
    return tuple(exports), tuple(imports)


def _line(lines: dict[str, list[int]], key: str, number: int) -> int | None:
    return lines[key][number] if number < len(lines.get(key, ())) else None


def _space(entry: dict[str, Any]) -> tuple[str, bool] | str:
    """(the pattern, whether a service) of an entry with one of ``events`` and ``service``."""
    kinds = [key for key in ("events", "service") if key in entry]
    if len(kinds) != 1:
        return 'one of events = "PATTERN" (events) or service = "PATTERN" (requests and their replies)'
    pattern = entry[kinds[0]]
    if not isinstance(pattern, str) or valid_pattern(pattern) is None or is_reserved(pattern):
        return f'{kinds[0]} must be a pattern of subjects (not a reserved $ one): {kinds[0]} = "orders.>"'
    return pattern, kinds[0] == "service"


def _export(entry: dict[str, Any]) -> Export | str:
    unknown = sorted(set(entry) - {"events", "service", "to"})
    if unknown:
        return f"unknown key {unknown[0]!r} (an export takes events or service, and to)"
    space = _space(entry)
    if isinstance(space, str):
        return space
    to = entry.get("to", [])
    if not isinstance(to, list) or not all(isinstance(name, str) for name in to):
        return "to must be a list of VPN names"
    return Export(space[0], tuple(to), space[1])


def _import(entry: dict[str, Any]) -> Import | str:
    unknown = sorted(set(entry) - {"vpn", "events", "service", "prefix"})
    if unknown:
        return f"unknown key {unknown[0]!r} (an import takes vpn, events or service, and prefix)"
    vpn = entry.get("vpn")
    if not isinstance(vpn, str) or not vpn:
        return "vpn must name the exporting VPN"
    space = _space(entry)
    if isinstance(space, str):
        return space
    prefix = entry.get("prefix", "")
    if not isinstance(prefix, str) or (
        prefix
        and (valid_pattern(prefix) is None or is_reserved(prefix) or set(prefix.split(".")) & {"*", "#", ">"})
    ):
        return f"prefix {str(prefix)[:40]!r} must be a subject without wildcards (or left out)"
    return Import(vpn, space[0], prefix, space[1])


def check_sharing(
    report: Report, sharing: dict[str, Numbered], lines: dict[str, dict[str, list[int]]]
) -> None:
    """What is wrong between VPNs: ``sharing`` and ``lines`` (each element's, by key) by VPN name."""
    for name, (exports, imports) in sharing.items():
        where = f"[vpns.{name}]"
        for number, export in exports:
            at, line = f"{where} exports[{number}]", _line(lines[name], "exports", number)
            for vpn in export.to:
                if vpn not in sharing:
                    report.add(("vpns", name), at, f"to names VPN {vpn!r}, which is not declared", line)
            for _, an_import in imports:
                if intersects(export.subjects, an_import.local):
                    report.add(
                        ("vpns", name),
                        at,
                        f"exports {export.subjects!r}, which meets {an_import.local!r} imported from "
                        f"{an_import.vpn!r}: imports are not passed on (no chains or cycles of VPNs); "
                        f"import from {an_import.vpn!r} itself",
                        line,
                    )
        for index, (number, an_import) in enumerate(imports):
            at, line = f"{where} imports[{number}]", _line(lines[name], "imports", number)
            if an_import.vpn == name:
                report.add(("vpns", name), at, "a VPN does not import from itself", line)
            elif an_import.vpn not in sharing:
                report.add(
                    ("vpns", name), at, f"imports from VPN {an_import.vpn!r}, which is not declared", line
                )
            elif not exported(tuple(e for _, e in sharing[an_import.vpn][0]), name, an_import):
                kind = "service" if an_import.service else "events"
                report.add(
                    ("vpns", name),
                    at,
                    f"{an_import.vpn!r} exports no {kind} covering {an_import.subjects!r} to {name!r} "
                    f"(add exports = [{{ {kind} = ... }}] to [vpns.{an_import.vpn}])",
                    line,
                )
            for other_number, other in imports[:index]:
                if intersect(an_import.local, other.local) is not None:
                    report.add(
                        ("vpns", name),
                        at,
                        f"{an_import.local!r} overlaps imports[{other_number}]'s {other.local!r}: "
                        "an event would arrive twice (give one another prefix, or narrow it)",
                        line,
                    )
