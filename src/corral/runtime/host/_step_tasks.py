"""Steps on Ray (`self.step(fn, ..., ray_options={...})`): one attempt is one Ray task.

The task runs `fn` with `corral.step_key()` set, wherever Ray places it (a GPU node,
a node with a custom resource); the host awaits its `ObjectRef`, which parks only the
step's own coroutine, never the host's event loop. If the host dies while the task
runs, the task's result has nowhere to go: the next holder of the shard runs `run()`
again, which reaches the step, finds no record and runs it again (at least once per
attempt, as any step whose host died: `corral.step_key()` lets the outside system
dedupe). A task whose node dies while the host lives is retried by Ray itself
(`max_retries`, 3 by default, may be set in `ray_options`), within the same attempt. A
task that outlives its timeout is cancelled.

The task answers where it ran (its node's id) and, when `fn` raised, the error and its
traceback as values (`TaskPlace`): the host raises that error itself, as a step run
here would, and its history names the node (a task's exception is never Ray's to
retry: the step's `RetryPolicy` retries it).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from corral._deadline import Expired, within
from corral._errors import InvalidArgumentError
from corral._tracing import Current, api, is_traceparent, parent_context, tracer
from corral.actors import current_step_key

__all__ = ["TaskPlace", "call_as_task"]

_remote: Any = None  # `ray.remote(_in_task)`, made once per process


@dataclass(slots=True)
class TaskPlace:
    """Where an attempt run as a Ray task ran (its node's id), and the traceback of the
    error it raised there (None: it returned)."""

    node: str | None = None
    traceback: str | None = None


def _in_task(fn: Callable[..., Any], args: tuple[Any, ...], key: str,
             trace: str | None = None) -> tuple[str, Any, tuple[Exception, str] | None]:
    """The body of the Ray task: `fn(*args)` with the step's key set, in the trace of
    its attempt (`trace`, on whichever node: `continued`); (the node's id, the value,
    None) or (the node's id, None, (the error, its traceback))."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    token = current_step_key.set(key)
    try:
        with continued(trace):
            if inspect.iscoroutinefunction(fn):
                return node, asyncio.run(fn(*args)), None
            return node, fn(*args), None
    except Exception as err:
        return node, None, (err, traceback.format_exc())
    finally:
        current_step_key.reset(token)


@contextlib.contextmanager
def continued(trace: str | None) -> Iterator[None]:
    """Continue the attempt's trace in the task: a span of its own if this worker
    traces (a tracer provider configured in it), else the attempt's context made
    current, so spans the step's code starts still join the trace."""
    if not is_traceparent(trace):
        yield
        return
    parent = parent_context(trace)
    t = tracer()
    if t is None:
        context = api().context
        attached = context.attach(parent)
        try:
            yield
        finally:
            context.detach(attached)
        return
    import ray

    with Current(t.start_span("corral step task", parent, attributes={
            "corral.ray.node_id": ray.get_runtime_context().get_node_id()})):
        yield


async def call_as_task(fn: Callable[..., Any], args: tuple[Any, ...], key: str,
                       timeout: float | None, ray_options: dict[str, Any],
                       place: TaskPlace | None = None, trace: str | None = None) -> Any:
    """One attempt of a step as a Ray task with `ray_options`, continuing the attempt's
    `trace`; its return value (or the error `fn` raised), and where it ran in `place`."""
    global _remote
    import ray

    if not ray.is_initialized():
        raise InvalidArgumentError("a step with ray_options needs Ray: run the entity on "
                                   "the Ray backend, or call ray.init() first")
    if _remote is None:
        _remote = ray.remote(_in_task)
    try:
        ref = _remote.options(**ray_options).remote(fn, args, key, trace)
    except (TypeError, ValueError) as err:
        raise InvalidArgumentError(f"step ray_options {ray_options!r:.200} refused by Ray: "
                                   f"{err}") from err
    # `within`, never `asyncio.wait_for` (before Python 3.12 that lost a stop's
    # cancellation that came as the task finished: `_steps._call` says more).
    try:
        node, value, failed = await within(_await(ref), timeout)
    except Expired:
        ray.cancel(ref, force=True)
        raise TimeoutError(f"the attempt did not finish within {timeout:g} s") from None
    except asyncio.CancelledError:
        ray.cancel(ref, force=True)
        raise
    if place is not None:
        place.node, place.traceback = node, None if failed is None else failed[1]
    if failed is not None:
        raise failed[0]
    return value


async def _await(ref: Any) -> Any:
    return await ref
