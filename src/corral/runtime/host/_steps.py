"""`RunSteps`: the durable steps of one activation's run (`Entity.step`).

Identity: a step is its name within its run. Not a position (the n-th step since
`run()` started): `run()` restarts from the top over the state of the latest snapshot,
which any snapshot (every N messages, passivation, a dead letter) may have taken while
`run()` was between two steps, so the same code path need not reach the same position
again; a name the code derives from what it works on (`f"model:{reply.id}"`) does.
Reusing a name within one activation before a `checkpoint()` covered it raises
`DuplicateStepError` (it would silently replay the other step's result).

A step's outcome (result or final failure) is recorded, fenced, before `run()` goes
on, with the sends made before it (`_outbox`); a replayed step drops the sends `run()`
made before it again, which were written then (a handler's stay: see `_run_context`).
The activation reads the run's records once, at its first step. A checkpoint deletes
the records it covers in the snapshot's transaction; the end of the run deletes the rest
(`persistence._ops_steps`).

History and metrics: each attempt is counted (`corral.metrics.step_attempted`, and
`step_failed` when the last one failed); a failed attempt that another follows writes
the step's row in history (fenced: a step still retrying is visible, with its attempts
so far and its last error), and the outcome's row goes with the record. A step that
succeeds at its first attempt writes nothing more than its record.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
import traceback
import typing
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import corral.metrics as metrics
from corral._common import RetryPolicy
from corral._deadline import Expired, within
from corral._errors import DuplicateStepError, InvalidArgumentError, StepFailedError
from corral.actors import current_step_key
from corral.persistence import (
    STEP_ERROR_CHARS,
    STEP_RESULT_CHARS,
    STEP_TRACEBACK_CHARS,
    Send,
    StepAttempts,
    StepRecord,
    StepStatus,
    storable_text,
)

from ..client._results import decode_value, encode_value
from ._residence import Residence, retrying
from ._step_tasks import TaskPlace
from ._traces import step_attempt

__all__ = ["RunSteps", "step_key_of"]

_DEFAULT_RETRY = RetryPolicy()
_MAX_NAME = 200


def step_key_of(entity_type: str, key: str, run_id: int, name: str) -> str:
    """`corral.step_key()` of step `name` of run `run_id` of `entity_type` `key`:
    `<type>/<key>/<run>/<name>`, with `%` and `/` in the key and the name written `%25`
    and `%2F`, so that each part is found again and no two steps share a key (key `a/1`
    step `x` and key `a` step `1/x` would both be `T/a/1/1/x`). A key and a name with
    neither, most of them, read as before the escaping (so a step in flight when that
    release came keeps its key); the type is an identifier, the run a number."""
    return f"{entity_type}/{_escaped(key)}/{run_id}/{_escaped(name)}"


def _escaped(part: str) -> str:
    return part.replace("%", "%25").replace("/", "%2F")


class SteppingRun(Protocol):
    """The run whose steps these are, and the sends its steps write along."""

    @property
    def run_id(self) -> int: ...
    @property
    def trace(self) -> str | None: ...  # the cause of its steps' spans (`_traces`)
    async def ready_to_send(self) -> None: ...
    def take_outgoing(self) -> tuple[Send, ...]: ...
    def written(self, sends: tuple[Send, ...]) -> None: ...
    def unwritten(self, sends: tuple[Send, ...], err: BaseException) -> None: ...
    def forget_outgoing(self) -> None: ...


class RunSteps:
    """The recorded steps of the activation's run, and the names it used."""

    __slots__ = ("_home", "_recorded", "_run", "_used")

    def __init__(self, home: Residence, run: SteppingRun) -> None:
        self._home = home
        self._run = run
        self._recorded: dict[str, StepRecord] | None = None  # read at the first step
        self._used: set[str] = set()

    async def step(self, fn: Callable[..., Any], args: tuple[Any, ...], *, name: str,
                   retry: RetryPolicy | None, timeout: float | None,
                   ray_options: dict[str, Any] | None) -> Any:
        home, run_id = self._home, self._run.run_id
        _check(fn, name, retry, timeout, ray_options)
        if name in self._used:
            raise DuplicateStepError(
                f"step {name!r} was used already by this run (since its last checkpoint): "
                "give each step its own name", entity_type=home.entity_type, key=home.key,
                run_id=run_id)
        self._used.add(name)
        if self._recorded is None:
            self._recorded = await retrying(home, run_id, "step", lambda: home.store.steps(
                home.entity_type, home.key, run_id))
        record, cause = self._recorded.get(name), None
        if record is None:
            key = step_key_of(home.entity_type, home.key, run_id, name)
            tries = _Tries(home.entity_type, run_id, name, home.clock.time(),
                           ray_options is not None)

            async def retrying_now(h: StepAttempts) -> None:
                await retrying(home, run_id, "step", lambda: home.store.record_step_attempt(
                    home.fence, home.entity_type, home.key, h))
            record, cause = await _attempts(fn, args, key, retry or _DEFAULT_RETRY,
                                            timeout, ray_options, home.clock.time, tries,
                                            retrying_now, self._run.trace)
            await self._run.ready_to_send()
            done, sends = record, self._run.take_outgoing()
            history = tries.history("completed" if done.ok else "failed", done.recorded_at,
                                    done.result)
            try:
                await retrying(home, run_id, "step", lambda: home.store.record_step(
                    home.fence, home.entity_type, home.key, run_id, done, sends=sends,
                    history=history))
            except BaseException as err:
                self._run.unwritten(sends, err)
                raise
            self._recorded[name] = record
            self._run.written(sends)
        else:  # the sends made before it were written then (with it, or a snapshot)
            self._run.forget_outgoing()
        if record.ok:
            return decode_value(record.result, _returns(fn))
        raise StepFailedError(
            f"step {name!r} failed after {record.attempts} attempts: {record.error}",
            step=name, attempts=record.attempts, error=record.error or "",
            entity_type=home.entity_type, key=home.key, run_id=run_id) from cause

    def completed(self) -> tuple[str, ...]:
        """The names of the steps recorded so far (a checkpoint now covers them)."""
        return tuple(self._recorded or ())

    def covered(self, names: tuple[str, ...]) -> None:
        """A checkpoint deleted the records of `names`: they may be used again."""
        for name in names:
            self._used.discard(name)
            if self._recorded is not None:
                self._recorded.pop(name, None)


class _Tries:
    """What the attempts of one step have come to, for its row in history."""

    __slots__ = ("attempts", "entity_type", "error", "name", "place", "run_id",
                 "started_at", "traceback")

    def __init__(self, entity_type: str, run_id: int, name: str, started_at: float,
                 ray_task: bool) -> None:
        self.entity_type, self.run_id, self.name = entity_type, run_id, name
        self.started_at = started_at
        self.attempts = 0
        self.error: str | None = None
        self.traceback: str | None = None
        self.place = TaskPlace() if ray_task else None  # a Ray task says where it ran

    def failed(self, err: Exception) -> None:
        """The current attempt raised `err`."""
        self.error = storable_text(f"{type(err).__name__}: {err}", STEP_ERROR_CHARS)
        remote = None if self.place is None else self.place.traceback
        self.traceback = storable_text(remote or "".join(traceback.format_exception(err)),
                                       STEP_TRACEBACK_CHARS, tail=True)

    def history(self, status: StepStatus, now: float, result: str | None = None
                ) -> StepAttempts:
        """The step's row in history, as of `now`."""
        return StepAttempts(
            self.run_id, self.name, status, self.attempts, self.started_at, now,
            None if result is None else storable_text(result, STEP_RESULT_CHARS),
            self.error, self.traceback, self.place is not None,
            None if self.place is None else self.place.node)


async def _attempts(fn: Callable[..., Any], args: tuple[Any, ...], key: str,
                    retry: RetryPolicy, timeout: float | None,
                    ray_options: dict[str, Any] | None, now: Callable[[], float],
                    tries: _Tries, on_retry: Callable[[StepAttempts], Awaitable[None]],
                    trace: str | None = None) -> tuple[StepRecord, Exception | None]:
    """Call `fn` until an attempt succeeds or `retry` runs out: the outcome to record,
    and the last error. Each attempt is counted in `tries` and the metrics, in its span
    (a child of `trace`: `_traces`); each failed one that another follows goes to
    `on_retry` (the step's row in history)."""
    etype, name = tries.entity_type, tries.name
    while True:
        tries.attempts += 1
        if tries.place is not None:  # a task that times out never says where it ran
            tries.place.node = tries.place.traceback = None
        began = time.perf_counter()
        try:
            with step_attempt(trace, name, tries.attempts, key,
                              on_ray=ray_options is not None) as attempt_trace:
                value = await _call(fn, args, key, timeout, ray_options, tries.place,
                                    attempt_trace)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            metrics.step_attempted(etype, name, time.perf_counter() - began)
            tries.failed(err)
            if retry.max_attempts is not None and tries.attempts >= retry.max_attempts:
                metrics.step_failed(etype, name)
                return StepRecord(name, False, None, tries.error, tries.attempts, now()), err
            await on_retry(tries.history("retrying", now()))
            await asyncio.sleep(retry.backoff(tries.attempts))
            continue
        metrics.step_attempted(etype, name, time.perf_counter() - began)
        try:
            text = encode_value(value)
        except Exception as err:
            raise InvalidArgumentError(
                f"step {name!r} returned {type(value).__name__}, which is not JSON data "
                "(return models, dicts, lists, str, numbers, bool or None)") from err
        return StepRecord(name, True, text, None, tries.attempts, now()), None


async def _call(fn: Callable[..., Any], args: tuple[Any, ...], key: str,
                timeout: float | None, ray_options: dict[str, Any] | None,
                place: TaskPlace | None = None, trace: str | None = None) -> Any:
    """One attempt: `fn(*args)` with `corral.step_key()` set, here or as a Ray task
    (which says where it ran in `place`, and continues the attempt's `trace`)."""
    if ray_options is not None:
        from ._step_tasks import call_as_task  # only a step on Ray imports Ray
        return await call_as_task(fn, args, key, timeout, ray_options, place, trace)
    token = current_step_key.set(key)
    try:
        # `within`, never `asyncio.wait_for`: before Python 3.12 that lost the
        # cancellation of a host stopping the entity as the attempt finished, and run()
        # went on while the stop waited for it.
        call = fn(*args) if inspect.iscoroutinefunction(fn) else \
            asyncio.to_thread(fn, *args)  # copies this context: the thread sees the key
        try:
            return await within(call, timeout)
        except Expired:
            raise TimeoutError(f"the attempt did not finish within {timeout:g} s") from None
    finally:
        current_step_key.reset(token)


def _returns(fn: Callable[..., Any]) -> Any:
    """`fn`'s return annotation (what a recorded result is rebuilt as), or None."""
    try:
        return _cached_returns(fn)
    except TypeError:  # a callable that cannot be hashed: not cached
        return _cached_returns.__wrapped__(fn)


@functools.lru_cache(maxsize=512)
def _cached_returns(fn: Callable[..., Any]) -> Any:
    try:
        return typing.get_type_hints(fn).get("return")
    except Exception:  # no annotations to resolve (a partial, a builtin, a bad ref)
        return None


def _check(fn: object, name: object, retry: object, timeout: object,
           ray_options: object) -> None:
    if not callable(fn):
        raise InvalidArgumentError(f"step fn must be callable, got {type(fn).__name__}")
    if not isinstance(name, str) or not 0 < len(name) <= _MAX_NAME \
            or not name.isprintable():
        raise InvalidArgumentError(
            f"step name must be a printable str of 1 to {_MAX_NAME} characters, got {name!r:.80}")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise InvalidArgumentError(f"step retry must be a corral.RetryPolicy, got {retry!r:.80}")
    if timeout is not None and (isinstance(timeout, bool)
                                or not isinstance(timeout, (int, float))
                                or not 0 < timeout < float("inf")):
        raise InvalidArgumentError(
            f"step timeout must be None or a positive number of seconds, got {timeout!r:.80}")
    if ray_options is not None and not isinstance(ray_options, dict):
        raise InvalidArgumentError(
            f"step ray_options must be a dict of Ray task options, got {ray_options!r:.80}")
