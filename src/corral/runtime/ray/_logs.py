"""Host actors' `corral.*` log records, on the drivers' Python logging.

A host actor runs in a Ray worker process: what it logs (a shard taken at an epoch, a
hand-off, a poison message's traceback, a suspended run) lands in Ray's worker log
files only. Ray's own streaming (`log_to_driver`) does not fit: it sends every line
of a worker's stdout and stderr, and only to the driver of the job that created the
actor (a detached actor outlives it; the next drivers never see its lines). So:

* each host actor attaches a `logging.Handler` to the `corral` logger (`ship_logs`):
  records at INFO or above become plain dicts (the message formatted, the traceback as
  text) in a bounded queue; a daemon thread sends them in batches to the *log relay*,
  so the actor's event loop never waits on it. A full queue drops records (counted);
  a relay that is gone costs a failed call per batch.
* the log relay (`LogRelay`) is one named, detached actor per Ray cluster
  (`corral/log-relay` in the Ray namespace `_corral`) holding the last `RELAY_CAPACITY`
  records in a ring, each with the deployment namespace it came from. It does not know
  its readers: a driver that is gone costs nothing. `stop_ray_hosts` stops it with the
  last deployment that has actors (`retire_relay`); the next deployment starts it again.
* every runtime opened with `backend="ray"` follows it (`LogFollower`): a long poll
  for the records of its namespace logged since it opened, each re-emitted through
  `logging.getLogger(<the same name>)` at the same level, with the actor's name as
  `processName`, its pid as `process`, the traceback as `exc_text`, the record's
  plain `extra=` fields kept, and marked `corral_relayed` (never shipped again).

What is shipped: `corral.*` at INFO and above, the level a host actor sets on `corral`
(a Ray worker's loggers are at WARNING); `corral.lifecycle` (one event per run started
or closed) stays off there, as it is by default in any process, unless the deployment's
actors are given `CORRAL_LIFECYCLE_EVENTS=1` (`open_runtime(..., env_vars=...)`, or a
roll's): a host actor's process cannot see its drivers' logging configuration, so the
switch travels in the environment it is created with.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import queue
import threading
import time
from typing import Any

__all__ = ["LIFECYCLE_EVENTS", "RELAY_CAPACITY", "LogFollower", "LogRelay", "relay",
           "retire_relay", "ship_logs"]

LIFECYCLE_EVENTS = "CORRAL_LIFECYCLE_EVENTS"
"""The environment variable that turns the lifecycle events (`corral.lifecycle`, INFO)
on in host actors: "1" on, "0" off (the default); checked by `_env.with_env_vars`."""

RELAY_CAPACITY = 5_000
"""Records the relay keeps (a driver further behind is told how many it missed)."""
SHIP_QUEUE = 1_000
"""Records an actor holds while the relay is slow or away; beyond, they are dropped."""
SHIP_LEVEL = logging.INFO
TEXT_LIMIT = 20_000
"""Characters kept of a message or a traceback."""
LONG_POLL = 5.0
"""Seconds a follower's read waits in the relay for new records."""
_RELAY_NAME, _RELAY_NAMESPACE = "corral/log-relay", "_corral"

log = logging.getLogger("corral.ray.logs")


class LogRelay:
    """The log relay actor's body (see the module docstring): a ring of records."""

    def __init__(self, capacity: int = RELAY_CAPACITY) -> None:
        self._records: collections.deque[dict[str, Any]] = collections.deque(maxlen=capacity)
        self._next = 0  # the sequence number of the next record
        self._arrived: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._arrived is None:  # made on the actor's event loop, by its first call
            self._arrived = asyncio.Event()
        return self._arrived

    async def append(self, records: list[dict[str, Any]]) -> None:
        """Keep `records` (the oldest fall out of the ring) and wake the readers."""
        for record in records:
            record["seq"] = self._next
            self._next += 1
            self._records.append(record)
        event, self._arrived = self._event(), asyncio.Event()
        event.set()

    async def read(self, namespace: str, after: int, since: float, timeout: float
                   ) -> tuple[int, list[dict[str, Any]], int]:
        """(cursor, records, missed): the records of `namespace` from sequence number
        `after` on that were logged at `since` (epoch s) or later, waiting up to
        `timeout` s for one; the cursor to ask with next; how many left the ring
        before they were read. A cursor beyond the end (a restarted relay) reads
        from its start."""
        if after > self._next:
            after = 0
        if after == self._next:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._event().wait(), timeout)
        oldest = self._next - len(self._records)
        missed = max(0, oldest - after) if after else 0
        found = [r for r in self._records if r["seq"] >= after
                 and r["namespace"] == namespace and r["created"] >= since]
        return self._next, found, missed

    async def shutdown(self) -> None:
        """Nothing to release (`retire_relay` kills it with the last deployment)."""


def relay() -> Any:
    """The cluster's log relay actor (created by the first to ask). Blocking: a GCS
    call."""
    import ray

    return ray.remote(LogRelay).options(
        name=_RELAY_NAME, namespace=_RELAY_NAMESPACE, get_if_exists=True,
        lifetime="detached", num_cpus=0, max_restarts=-1, max_concurrency=1_000,
    ).remote()


def retire_relay(namespace: str) -> bool:
    """Stop the cluster's log relay once `stop_ray_hosts` stopped the deployment
    `namespace`, unless another deployment still has actors (it ships to the relay);
    whether it was stopped. Blocking.

    What it held is gone with it: a runtime of another deployment opened since, or one
    of `namespace` still open, recreates it at its next read (`relay()` gets or creates
    it), from an empty ring."""
    import ray

    others = sorted({a["namespace"] for a in ray.util.list_named_actors(all_namespaces=True)
                     if a["namespace"] not in (namespace, _RELAY_NAMESPACE)
                     and a["name"].startswith(f"corral/{a['namespace']}/")})
    if others:
        log.debug("log relay kept: deployments %s still run", ", ".join(others))
        return False
    try:
        handle = ray.get_actor(_RELAY_NAME, namespace=_RELAY_NAMESPACE)
    except ValueError:  # never started, or gone already
        return False
    ray.kill(handle, no_restart=True)
    return True


# -- the actors' side ------------------------------------------------------------------


_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
_PLAIN = (str, int, float, bool, type(None))


def _entry(record: logging.LogRecord, namespace: str, actor: str) -> dict[str, Any]:
    # Fields a record carries beyond the standard ones (`extra=`) travel if plain.
    extra = {k: v for k, v in record.__dict__.items()
             if k not in _STANDARD and isinstance(v, _PLAIN)}
    exc_text = record.exc_text
    if record.exc_info and not exc_text:
        exc_text = logging.Formatter().formatException(record.exc_info)
    return {
        **extra, "namespace": namespace, "name": record.name, "levelno": record.levelno,
        "levelname": record.levelname, "msg": record.getMessage()[:TEXT_LIMIT],
        "exc_text": exc_text[-TEXT_LIMIT:] if exc_text else None,
        "stack_info": record.stack_info, "created": record.created,
        "msecs": record.msecs, "pathname": record.pathname, "filename": record.filename,
        "module": record.module, "lineno": record.lineno, "funcName": record.funcName,
        "process": record.process, "processName": actor, "threadName": record.threadName,
        "corral_actor": actor,
    }


class _Shipper(logging.Handler):
    """Queues each `corral.*` record; a daemon thread sends them to the relay."""

    def __init__(self, namespace: str, actor: str) -> None:
        super().__init__(SHIP_LEVEL)
        self.namespace = namespace
        self.actor = actor
        self.dropped = 0
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(SHIP_QUEUE)
        threading.Thread(target=self._send, name="corral-log-shipper", daemon=True).start()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "corral_relayed", False):  # a follower's re-emitted record
            return
        try:
            self._queue.put_nowait(_entry(record, self.namespace, self.actor))
        except queue.Full:
            self.dropped += 1
        except Exception:
            self.handleError(record)

    def _send(self) -> None:
        # Logs nothing itself under `corral`: a failure would ship another record. Waits
        # on the call's future, never `ray.get`: Ray warns of a "blocking ray.get inside
        # async actor" for a `ray.get` from any thread of a host actor's process, this
        # one included, though it blocks only this thread.
        handle: Any = None
        while True:
            batch = [self._queue.get()]
            with contextlib.suppress(queue.Empty):
                while len(batch) < 256:
                    batch.append(self._queue.get_nowait())
            try:
                handle = handle or relay()
                handle.append.remote(batch).future().result(timeout=30)
            except Exception:  # the relay restarting or gone: this batch is lost
                handle = None
                time.sleep(1.0)


_shipper: _Shipper | None = None


def ship_logs(namespace: str, actor: str) -> None:
    """Send this process's `corral.*` records (INFO and above) to the log relay, as
    `actor` of the deployment `namespace`. Once per process (a host actor's)."""
    global _shipper
    if _shipper is not None:
        return
    _shipper = _Shipper(namespace, actor)
    corral_log = logging.getLogger("corral")
    corral_log.addHandler(_shipper)
    if corral_log.getEffectiveLevel() > SHIP_LEVEL:  # a worker's root logger: WARNING
        corral_log.setLevel(SHIP_LEVEL)
    # Lifecycle events are one per run started or closed: off unless turned on, as in
    # any process (`_events`); the shard-level news has its own INFO records.
    lifecycle = logging.getLogger("corral.lifecycle")
    if os.environ.get(LIFECYCLE_EVENTS) == "1":
        lifecycle.setLevel(logging.INFO)
    elif lifecycle.level == logging.NOTSET:
        lifecycle.setLevel(logging.WARNING)


# -- the drivers' side -----------------------------------------------------------------


def _emit(entry: dict[str, Any]) -> None:
    logger = logging.getLogger(entry["name"])
    if logger.isEnabledFor(entry["levelno"]):
        logger.handle(logging.makeLogRecord(
            {**entry, "args": None, "exc_info": None, "corral_relayed": True}))


class LogFollower:
    """A runtime's view of its deployment's host actors' logs (see the module
    docstring): `open` follows the relay from `since` (default: now) on, `close` stops."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._task: asyncio.Task[None] | None = None

    def open(self, since: float | None = None) -> None:
        self._task = asyncio.create_task(
            self._follow(time.time() if since is None else since), name="corral-logs")

    async def _follow(self, since: float) -> None:
        import ray

        handle: Any = None
        cursor, delay = 0, 0.1
        while True:
            try:
                handle = handle or await asyncio.to_thread(relay)
                cursor, records, missed = await handle.read.remote(
                    self.namespace, cursor, since, LONG_POLL)
            except (ray.exceptions.RayError, OSError) as err:
                handle = None  # the relay restarts (max_restarts): ask again
                log.debug("log relay unavailable (%s); retrying in %.1f s", err, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.1
            if missed:
                log.warning("%d log records of the Ray cluster's host actors left the "
                        "relay's ring before this process read them", missed)
            for entry in records:
                _emit(entry)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

