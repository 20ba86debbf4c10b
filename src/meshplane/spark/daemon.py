"""PySpark's worker daemon (``pyspark.daemon``), without the traceback of a worker whose JVM hung up.

When a session stops while a reused Python worker waits for its next task, or when Spark gives up on
a worker, the JVM closes the worker's socket. The worker's last flush then fails with a broken pipe and
Spark 4 ends it by letting the error out of ``pyspark.daemon.worker`` (its
``killWorkerOnFlushFailure``), where the daemon prints its traceback (SPARK-54344): every clean stop of
a session that ran Python ends with one on stderr. Here such a worker ends the same way, quietly: the
only reader of what it would report has gone. Anything else is PySpark's as before.
``spark_session()`` sets ``spark.python.daemon.module`` to this module.

PySpark's daemon runs a full ``gc.collect()`` after every task of a reused worker, which walked the
~46,000 objects each forked worker inherits (PySpark's imports): ~17-23 ms of CPU per task, twice per
read in the driver's planning workers alone. The daemon freezes what it holds before it forks
(``gc.freeze``, made for this), so a worker's collections walk only its own objects (~5 ms).
"""

from __future__ import annotations

import gc
from typing import Any

import pyspark.daemon as daemon

_worker = daemon.worker


def quiet_worker(sock: Any, authenticated: bool) -> int:
    """``pyspark.daemon.worker``, whose broken connection to the JVM ends the worker (the nonzero code
    the daemon's loop stops on) instead of raising."""
    try:
        return int(_worker(sock, authenticated))
    except (BrokenPipeError, ConnectionResetError):
        return 1


if __name__ == "__main__":
    gc.collect()  # nothing collectable is frozen with the rest
    gc.freeze()  # the forked workers' collections skip what they inherit
    daemon.worker = quiet_worker  # manager() looks it up for every task
    daemon.manager()
