"""The Python that a local Spark session starts for its workers: this interpreter, importing PySpark
from its installed package rather than from the zip Spark puts first on a worker's ``PYTHONPATH``.

Python cannot cache bytecode for a zip, so every Python process Spark starts from it compiles PySpark
anew: about a second here, paid by each query's streaming source runner and each read's planner
(Parquet's JVM source pays nothing of the kind). The zips of a pip-installed PySpark are copies of
the package beside them, so leaving them out imports the same code, compiled once. Anything else on
the path is kept. Installed as the ``meshplane-spark-python`` command; ``spark_session()`` uses it.

This module imports nothing of meshplane or PySpark: it runs before each of Spark's Python processes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def _bundled(entry: str) -> tuple[Path, str] | None:
    """(site-packages, package) of a zip a pip-installed PySpark ships in
    ``<site-packages>/pyspark/python/lib``, else ``None``."""
    zipped = Path(entry)
    lib = zipped.parent
    if (lib.name, lib.parent.name, lib.parent.parent.name) != ("lib", "python", "pyspark"):
        return None
    if zipped.name == "pyspark.zip":
        return lib.parent.parent.parent, "pyspark"
    if zipped.name.startswith("py4j-") and zipped.suffix == ".zip":
        return lib.parent.parent.parent, "py4j"
    return None


def without_bundled_zips(python_path: str, importable_from: list[str]) -> str:
    """``python_path`` without the zips of a PySpark whose packages are importable, as files, from one
    of ``importable_from`` (this interpreter's ``sys.path``)."""
    roots = {os.path.realpath(p) for p in importable_from if p}
    kept = []
    for entry in python_path.split(os.pathsep):
        found = _bundled(entry)
        if found is not None:
            site, package = found
            if os.path.realpath(site) in roots and (site / package / "__init__.py").is_file():
                continue  # imported from the installed package instead
        kept.append(entry)
    return os.pathsep.join(kept)


def main() -> None:
    path = os.environ.get("PYTHONPATH")
    if path:
        os.environ["PYTHONPATH"] = without_bundled_zips(path, sys.path)
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
