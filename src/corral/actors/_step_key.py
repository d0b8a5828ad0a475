"""The entity side of durable steps: the idempotency key a step's function can read.

The host (`runtime.host._steps`) sets it around every attempt of a step, in this process or
in the Ray task that runs the step, so `corral.step_key()` works in both.
"""

from __future__ import annotations

from contextvars import ContextVar

from corral._errors import InvalidArgumentError

__all__ = ["current_step_key", "step_key"]

current_step_key: ContextVar[str | None] = ContextVar("corral_step_key", default=None)


def step_key() -> str:
    """The idempotency key of the step whose function is running now.

    Stable for the step: the same on every attempt and after every restart of `run()`
    (`"<entity type>/<key>/<run id>/<step name>"`, with `%` and `/` in the key and the
    name written `%25` and `%2F`), and different for every other step of every entity.
    Pass it to the outside system (an `Idempotency-Key` header, a request id) so that
    an attempt repeated after a crash, or a retry after a timeout, is not applied twice
    there.

    Raises:
        InvalidArgumentError: called outside a step's function.

    Example:
        async def charge(amount: int) -> str:
            return await payments.charge(amount, idempotency_key=corral.step_key())
    """
    key = current_step_key.get()
    if key is None:
        raise InvalidArgumentError("corral.step_key() is only set inside a step's function "
                                   "(await self.step(fn, ...))")
    return key
