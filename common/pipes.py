"""A command-line program whose reader went away (`xsg pdp decide ... | head`) ends quietly.

When the program at the other end of a pipe exits, the next write (or the flush at exit) raises
BrokenPipeError: Python would print a traceback, then "Exception ignored ... BrokenPipeError" at
exit. Unix tools die of SIGPIPE instead, silently, and the shell reports 128 + 13 = 141; so does
a program run through `quiet_on_broken_pipe`. Its remaining output goes to /dev/null (what the
reader no longer wants), as Python's documentation advises for SIGPIPE.
"""
from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

# what a shell reports for a program that SIGPIPE ended (1 where there is no such signal)
BROKEN_PIPE_STATUS = 128 + int(getattr(signal, "SIGPIPE", -127))


def quiet_on_broken_pipe(run: Callable[[], int]) -> int:
    """`run()`'s exit status, its output flushed before it returns, so that a reader gone is
    noticed here and not at the interpreter's exit; BROKEN_PIPE_STATUS, quietly, when it is."""
    try:
        status = run()
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the flush at exit writes nowhere, silently
        os.close(devnull)
        return BROKEN_PIPE_STATUS


__all__ = ["BROKEN_PIPE_STATUS", "quiet_on_broken_pipe"]
