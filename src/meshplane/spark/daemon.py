"""PySpark's worker daemon (``pyspark.daemon``), without the traceback of a worker whose JVM hung up.

When a session stops while a reused Python worker waits for its next task, or when Spark gives up on
a worker, the JVM closes the worker's socket. The worker's last flush then fails with a broken pipe and
Spark 4 ends it by letting the error out of ``pyspark.daemon.worker`` (its
``killWorkerOnFlushFailure``), where the daemon prints its traceback (SPARK-54344): every clean stop of
a session that ran Python ends with one on stderr. Here such a worker ends the same way, quietly: the
only reader of what it would report has gone. Anything else is PySpark's as before.
``spark_session()`` sets ``spark.python.daemon.module`` to this module.
"""

from __future__ import annotations

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
    daemon.worker = quiet_worker  # manager() looks it up for every task
    daemon.manager()
