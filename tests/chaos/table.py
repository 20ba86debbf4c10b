"""The results table of docs/chaos.md: one row per workload and nemesis."""

from __future__ import annotations

from typing import Any

BEGIN, END = "<!-- chaos-table -->", "<!-- /chaos-table -->"
COLUMNS = (
    "operations",
    "acknowledged",
    "lost",
    "unreadable",
    "duplicated",
    "reordered",
    "unexpected",
    "moved",
    "gaps",
)


def markdown(reports: list[dict[str, Any]]) -> str:
    head = "| workload | nemesis | fsync | seed | faults | " + " | ".join(COLUMNS) + " | unknown (arrived) |"
    rows = [head, "|" + "---|" * (len(COLUMNS) + 6)]
    for report in reports:
        total = report["total"]
        cells = [
            report["workload"],
            "+".join(report["nemeses"]) if len(report["nemeses"]) < 3 else f"{len(report['nemeses'])} mixed",
            report.get("fsync", "always"),
            str(report["seed"]),
            str(len(report["faults"])),
            *(str(total.get(column, 0)) for column in COLUMNS),
            f"{total['indeterminate']} ({total['indeterminate_arrived']})",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def replace_table(document: str, table: str) -> str:
    """``document`` with what lies between the markers replaced by ``table``."""
    start, end = document.index(BEGIN) + len(BEGIN), document.index(END)
    return document[:start] + "\n" + table + document[end:]
