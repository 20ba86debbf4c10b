"""meshplane's optional C extensions of the core (``_records.c``, ``mesh/_frames.c``): each takes only
the path where nothing is unusual and leaves the rest to the Python code beside it, which stays the
reference (differential tests hold the two to the same output)."""

from __future__ import annotations

import importlib
import os
import types


def compiled(name: str) -> types.ModuleType | None:
    """The extension module ``name``, or None where it was not built (no C compiler at install) or
    ``MESHPLANE_NO_EXTENSIONS`` is set."""
    if os.environ.get("MESHPLANE_NO_EXTENSIONS"):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
