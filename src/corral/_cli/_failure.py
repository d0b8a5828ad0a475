"""How a command fails: one line on stderr and an exit status, or a traceback with
`--debug`.

Exit statuses (every error one line on stderr, a usage error too: `report_usage`): 0
done; 1 the runtime refused or failed (not running, no such dead
letter, an idempotency conflict, unauthorized, the store failed, or some items of a
bulk command failed); 2 bad input, which no retry fixes (a usage error, an unknown
type, handler or wait, a bad key, payload, JSON or argument, an `--app` that does not
load or build, a store that is not there or is no corral store, `:memory:`). Nothing is
stored for bad input: the runtime validates every call before it stores anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import typer

from corral._errors import (
    CorralError,
    InvalidArgumentError,
    InvalidKeyError,
    InvalidPayloadError,
    UnknownEntityTypeError,
    UnknownHandlerError,
)

from ._output import printable

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
    "Settings",
    "debugging",
    "execute",
    "exit_status",
    "guard",
    "is_usage_error",
    "one_line",
    "parse_json",
    "report",
    "report_usage",
]

T = TypeVar("T")

EXIT_FAILED = 1
"""The runtime refused or failed."""
EXIT_BAD_INPUT = 2
"""The input is wrong; the same command never succeeds (click's status for usage errors)."""

_BAD_INPUT = (InvalidArgumentError, InvalidKeyError, InvalidPayloadError,
              UnknownEntityTypeError, UnknownHandlerError)
_NOISE = "For further information visit"  # pydantic's link after each validation error


@dataclass(frozen=True)
class Settings:
    """The global options, kept on the root context (`ctx.obj`) for every command."""

    debug: bool = False


def exit_status(err: BaseException) -> int:
    """The exit status for `err` (see the module docstring); a plain `ValueError` (from
    the dashboard: a bad token) is bad input too."""
    return EXIT_BAD_INPUT if isinstance(err, (*_BAD_INPUT, ValueError)) else EXIT_FAILED


def one_line(err: BaseException) -> str:
    """`ErrorType: message`, the message's lines joined (a validation error has many)."""
    lines = [line.strip() for line in str(err).splitlines()]
    text = " ".join(line for line in lines if line and not line.startswith(_NOISE))
    return f"{type(err).__name__}: {text}"


def report(err: BaseException, *, about: str = "") -> None:
    """Print `err` as one line on stderr: `error: ErrorType: [about: ]message`, its
    control characters escaped (`_output.printable`)."""
    name, _, text = one_line(err).partition(": ")
    line = f"error: {name}: {about}{': ' if about else ''}{text}"
    print(printable(line), file=sys.stderr)


def is_usage_error(err: BaseException) -> bool:
    """Whether `err` is one of click's own errors (a missing, unknown or out-of-range
    option or argument). Told by module: typer 0.12 raises `click`'s, later releases
    those of the copy of click they carry (`typer._click`), with no public base class."""
    return type(err).__module__.endswith("click.exceptions") and hasattr(err, "exit_code")


def report_usage(err: Any) -> int:
    """Print a usage error of click's (`is_usage_error`) like any other error, one line
    (`error: NoSuchOption: corral ls: No such option: --bogus (corral ls -h for help)`)
    rather than click's boxed panel; its exit status (2). A bare group (`corral`) prints
    its help instead."""
    if type(err).__name__ == "NoArgsIsHelpError":
        err.show()
        return int(err.exit_code)
    ctx = getattr(err, "ctx", None)
    where = f"{ctx.command_path}: " if ctx is not None else ""
    hint = f" ({ctx.command_path} -h for help)" if ctx is not None else ""
    text = " ".join(err.format_message().split())  # one line, whatever click wrapped
    print(printable(f"error: {type(err).__name__}: {where}{text}{hint}"), file=sys.stderr)
    return int(err.exit_code)


def execute(ctx: typer.Context, work: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine under `guard`."""
    with guard(ctx):
        return asyncio.run(work)


@contextlib.contextmanager
def guard(ctx: typer.Context, *also: type[Exception]) -> Iterator[None]:
    """Turn a `CorralError` (or one of `also`) into one line on stderr and an exit
    status; under `--debug` it propagates with its traceback instead."""
    caught: tuple[type[Exception], ...] = (CorralError, *also)
    try:
        yield
    except caught as err:
        if debugging(ctx):
            raise
        report(err)
        raise typer.Exit(exit_status(err)) from None


def parse_json(text: str | None, option: str) -> Any:
    """The JSON value of an option (None if it was not given).

    Raises:
        InvalidPayloadError: not JSON, or an object with a key twice (which plain
            `json.loads` would silently resolve to the last value).
    """
    if text is None:
        return None
    try:
        return json.loads(text, object_pairs_hook=lambda pairs: _unique(pairs, option))
    except json.JSONDecodeError as err:
        raise InvalidPayloadError(f"{option} is not JSON: {err}") from None
    except RecursionError:
        raise InvalidPayloadError(f"{option} is nested too deeply") from None


def _unique(pairs: list[tuple[str, Any]], option: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, value in pairs:
        if name in found:
            raise InvalidPayloadError(f"{option} has the key {name!r} twice")
        found[name] = value
    return found


def debugging(ctx: typer.Context) -> bool:
    """Whether `--debug` was given (errors then propagate with their traceback)."""
    return isinstance(ctx.obj, Settings) and ctx.obj.debug
