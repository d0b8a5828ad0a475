"""What every worker process of the multi-process tests shares: stack dumps for one
that hangs (`install()` in the worker's main, then `Worker.stacks()` in the test sends
SIGUSR1 and reads the dump from the worker's log), and the go-file / report-file
handshake with the test.

A plain module (workers import it by name, with `tests/` on their `PYTHONPATH`).
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["install", "wait_for_file", "write_json"]


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


async def wait_for_file(path: Path, timeout: float = 60.0) -> None:
    """Until the test creates `path` (a go signal)."""
    deadline = time.monotonic() + timeout
    while not path.exists():  # noqa: ASYNC240 (a stat of a local file; microseconds)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        await asyncio.sleep(0.002)


def write_json(path: Path, data: Any) -> None:
    """Write atomically, so the test never reads a half-written file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
