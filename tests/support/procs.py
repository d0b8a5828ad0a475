"""Shared test helpers: polling, and worker subprocesses (and `sql`, from `stores`).

A plain module (not a conftest): test modules import it by name, `from procs import ...`,
as they do `entities` (pytest puts `tests/` on `sys.path`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path

from stores import sql

__all__ = ["TESTS", "Worker", "spawner", "sql", "wait_for_exit", "wait_until"]

TESTS = Path(__file__).resolve().parent  # tests/support: the helpers and worker scripts


async def wait_until(predicate: Callable[[], Awaitable[bool] | bool], what: str, *,
                     timeout: float = 30.0, alive: Sequence[Worker] = (),
                     progress: Callable[[], Awaitable[object]] | None = None) -> None:
    """Poll `predicate` until it holds; fail early if a worker in `alive` died.

    With `progress`, `timeout` bounds a stall rather than the whole wait: the deadline
    restarts each time `progress()` returns a new value (a backlog being worked off)."""
    deadline = time.monotonic() + timeout
    last = await progress() if progress else None
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        for worker in alive:
            worker.check_alive()
        if progress and (now := await progress()) != last:
            last, deadline = now, time.monotonic() + timeout
        if time.monotonic() > deadline:
            stalled = f" with no progress from {last!r}" if progress else ""
            raise AssertionError(f"timed out after {timeout} s{stalled} waiting until {what}")
        await asyncio.sleep(0.01)


async def wait_for_exit(workers: Sequence[Worker], *, timeout: float = 90.0) -> None:
    """Until every worker exited, each with status 0; one that hangs is reported with
    its stacks (`Worker.stacks`)."""
    try:
        await wait_until(lambda: all(w.proc.poll() is not None for w in workers),
                         "the workers exit", timeout=timeout)
    except AssertionError as err:
        hung = [w for w in workers if w.proc.poll() is None]
        raise AssertionError("\n".join([str(err)] + [f"== {w.name} (still running):\n"
                                                      f"{w.stacks()}" for w in hung])) from None
    for worker in workers:
        worker.check_exited_cleanly()


class Worker:
    """One `python <script> <role> <args...>` subprocess, run in `tmp_path` with `tests/`
    on its `PYTHONPATH`; its stdout and stderr go to `<tmp_path>/<name>.log`."""

    def __init__(self, tmp_path: Path, name: str, role: str, *args: str, script: Path) -> None:
        self.name = name
        self.log = tmp_path / f"{name}.log"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(TESTS), env.get("PYTHONPATH", "")) if p)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(script), role, *args],
                env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
            )

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise AssertionError(f"worker {self.name} exited with {code}:\n{self.output}")

    def check_exited_cleanly(self) -> None:
        code = self.proc.poll()
        assert code == 0, f"worker {self.name} exited with {code}:\n{self.output}"

    def stacks(self) -> str:
        """The worker's log after asking it to dump its stacks (`workers.install()`):
        for a failure message about a worker that hangs."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGUSR1)
            deadline = time.monotonic() + 5
            while "--- end of stacks ---" not in self.output and time.monotonic() < deadline:
                time.sleep(0.05)
        return self.output

    def sigkill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


@contextlib.contextmanager
def spawner(tmp_path: Path, script: Path) -> Iterator[Callable[..., Worker]]:
    """Yield `start(name, role, *args) -> Worker` running `script`; every worker still
    running is killed on exit. A module's `spawn` fixture wraps this."""
    started: list[Worker] = []

    def start(name: str, role: str, *args: str) -> Worker:
        worker = Worker(tmp_path, name, role, *args, script=script)
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.stop()
