"""Spark's Python daemon (`pyspark.daemon`) without the traceback a worker prints when Spark
closes its connection: the gateway's Spark (a local master) runs it as
`spark.python.daemon.module` (`pep.runtime.session`).

Spark stops a Python worker that stayed idle for a minute, and every worker when the session
stops, by closing its connection. The worker, waiting for its next task, then fails to flush
its output, and PySpark's daemon (`spark.python.daemon.killWorkerOnFlushFailure`, on by
default) lets the `BrokenPipeError` go up to its manager, which prints the traceback to the
JVM's stderr: the gateway's log, at every stop of a gateway that has used its Python workers
(which it starts with its session: `python_workers.py`), and once a minute after any Python work.
No task is lost there (the connection is gone); here such a worker ends with a nonzero code
and says nothing. Every other error of a worker goes up as before.

Only where the workers run the gateway's own interpreter (a local master, `PYSPARK_PYTHON`
this process's Python): a cluster's workers need not have xsg installed.
"""
from __future__ import annotations

import socket

from pyspark import daemon

_worker = daemon.worker


def quiet_worker(sock: socket.socket, authenticated: bool) -> int:
    """`pyspark.daemon.worker`, a connection Spark closed ending the worker with code 1."""
    try:
        return _worker(sock, authenticated)
    except (BrokenPipeError, ConnectionResetError):
        return 1


daemon.worker = quiet_worker

if __name__ == "__main__":
    daemon.manager()
