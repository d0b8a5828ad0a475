"""Stack dumps for worker processes that hang: `install()` in the worker, then
`Worker.stacks()` in the test sends SIGUSR1 and reads the dump from the worker's log.

A plain module (workers import it by name, with `tests/` on their `PYTHONPATH`).
"""

from __future__ import annotations

import asyncio
import faulthandler
import signal
import sys
from types import FrameType

__all__ = ["install"]


def _dump(signum: int, frame: FrameType | None) -> None:
    print(f"--- stacks (signal {signum}) ---", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(all_threads=True)
    try:
        tasks = asyncio.all_tasks()  # the running loop's, when the signal lands inside it
    except RuntimeError:
        tasks = set()
    for task in tasks:
        print(f"--- {task!r}", file=sys.stderr)
        task.print_stack(file=sys.stderr)
    print("--- end of stacks ---", file=sys.stderr, flush=True)


def install() -> None:
    """Dump every thread's and every asyncio task's stack to stderr on SIGUSR1."""
    signal.signal(signal.SIGUSR1, _dump)
