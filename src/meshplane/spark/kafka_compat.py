"""What ``register(spark)`` adjusts so a Kafka job ports with its format name changed and nothing else.

- **Save modes.** Spark refuses its own default mode (ErrorIfExists) for every Python data source
  before the source is asked; Kafka's sink takes it, and Append, as "add these records". The writer
  of a session where meshplane is registered turns ErrorIfExists into Append for
  ``format("meshplane")`` only (Overwrite is refused by the sink, Ignore by Spark, as Kafka's are).
- **One-line errors.** PySpark puts a Python worker's traceback into the error it raises; with
  ``spark.sql.execution.pyspark.udf.hideTraceback.enabled`` it gives the exception's line alone, as
  Kafka's source gives its Java message.
- **A quiet stop.** ``query.stop()`` closes the socket of PySpark's streaming source runner (the
  process that runs the source's driver side) while it waits: its exit on the closed socket is
  expected, and its traceback is dropped.
"""

from __future__ import annotations

import functools
import sys
from types import TracebackType
from typing import Any

HIDE_TRACEBACK = "spark.sql.execution.pyspark.udf.hideTraceback.enabled"
STREAMING_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
_ERROR_MODES = ("error", "errorifexists", "default")


def one_line_errors(spark: Any) -> None:
    spark.conf.set(HIDE_TRACEBACK, "true")


def default_save_mode_appends() -> None:
    """Wrap ``DataFrameWriter`` (once per process) so ``format("meshplane")`` with the default mode
    appends. Other formats are untouched."""
    from pyspark.sql.readwriter import DataFrameWriter

    if getattr(DataFrameWriter, "_meshplane_wrapped", False):
        return
    original_format, original_mode, original_save = (
        DataFrameWriter.format,
        DataFrameWriter.mode,
        DataFrameWriter.save,
    )

    @functools.wraps(original_format)
    def format(self: Any, source: str) -> Any:
        self._meshplane_format = str(source).lower()
        return original_format(self, source)

    @functools.wraps(original_mode)
    def mode(self: Any, saveMode: str | None) -> Any:
        if saveMode is not None:
            self._meshplane_mode = str(saveMode).lower()
        return original_mode(self, saveMode)

    @functools.wraps(original_save)
    def save(
        self: Any,
        path: str | None = None,
        format: str | None = None,
        mode: str | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        chosen = str(format or getattr(self, "_meshplane_format", "")).lower()
        current = str(mode or getattr(self, "_meshplane_mode", "errorifexists")).lower()
        if chosen == "meshplane" and current in _ERROR_MODES:
            mode = "append"  # Kafka's sink: the default mode adds the records
        return original_save(self, path, format, mode, *args, **kwargs)

    DataFrameWriter.format = format  # type: ignore[method-assign]
    DataFrameWriter.mode = mode  # type: ignore[method-assign]
    DataFrameWriter.save = save  # type: ignore[method-assign]
    DataFrameWriter._meshplane_wrapped = True  # type: ignore[attr-defined]


def quiet_runner_exit() -> None:
    """In PySpark's streaming source runner, drop the traceback of its exit on a closed socket (a
    stopped query); any other exit is reported as before. Elsewhere, nothing changes."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if getattr(spec, "name", None) != STREAMING_RUNNER or getattr(sys.excepthook, "_meshplane", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if not _closed_socket(value):
            previous(kind, value, tb)

    hook._meshplane = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def _closed_socket(exc: BaseException | None) -> bool:
    """True when ``exc`` and what it was raised while handling are all a closed connection."""
    closed: tuple[type[BaseException], ...] = (BrokenPipeError, ConnectionResetError, EOFError)
    seen = 0
    while exc is not None and seen < 10:
        if not isinstance(exc, closed):
            return False
        exc, seen = exc.__context__, seen + 1
    return seen > 0
