"""Which query a task belongs to: the name under which a query's progress is noted on the server.

Kafka gives each query its own consumer group; here each query gets its own reader view. Python
sources' planners run in a process of their own that is told nothing about the query, but every task
carries the query's local properties: its id (made when the checkpoint was, kept in it: the same
across restarts on the checkpoint, another for another checkpoint) and its job description, whose
first line is the ``queryName``. So the view is named by the query name when there is one, else by
the checkpoint's query id.
"""

from __future__ import annotations

import logging
import re
from typing import Any

log = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")
_warned = False


def query_reader(context: Any, fallback: str) -> tuple[str, str]:
    """(view name, how it was chosen) for the query running the task of ``context``; ``fallback``
    (a hash of the source's options) with a warning when the task says nothing about its query."""
    global _warned
    properties = (lambda name: context.getLocalProperty(name)) if context is not None else (lambda _: None)
    query_id = properties("sql.streaming.queryId")
    description = properties("spark.job.description") or ""
    first, _, rest = description.partition("\n")
    if query_id and first.strip() and rest.startswith("id = "):
        return "spark-query-" + _UNSAFE.sub("_", first.strip())[:180], "queryName"
    if query_id:
        return f"spark-{query_id}", "checkpoint"
    if not _warned:
        _warned = True
        log.warning(
            "meshplane: this task does not say which query it belongs to; its progress is noted as %r, "
            "a name every query reading the same way shares (their lag views may merge): set readerName",
            fallback,
        )
    return fallback, "options"
