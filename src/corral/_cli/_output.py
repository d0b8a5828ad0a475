"""What the commands print: JSON for scripts, rich tables and one-liners for people.

Tables go to stdout through one rich `Console` with markup off (keys, errors and
payloads are shown as they are, never read as rich markup); when stdout is not a
terminal it is as wide as a line needs, so `corral ls | grep` sees whole rows. Every
cell is `printable`: a control character in a handler's error or an application's key
(an escape sequence that would retitle or clear the operator's terminal) is shown as
its Python escape, `\\x1b`, never sent to the terminal. JSON escapes them itself.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from pydantic_core import to_jsonable_python
from rich import box
from rich.console import Console
from rich.table import Table

__all__ = ["age", "cells", "err_console", "jsonable", "out", "print_json", "print_result",
           "printable", "table", "when"]

_PIPE_WIDTH = 1000  # characters: rows are never wrapped or cut when piped
# C0 and C1 controls, DEL, the line and paragraph separators, and the bidirectional
# overrides and isolates (which reorder what the terminal shows).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _console(*, stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    wide = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(file=stream, markup=False, highlight=False, emoji=False,
                   width=_PIPE_WIDTH if wide else None)


def out() -> Console:
    """The console on stdout."""
    return _console(stderr=False)


def err_console() -> Console:
    """The console on stderr (progress bars)."""
    return _console(stderr=True)


def jsonable(value: object) -> Any:
    """Plain JSON data: dataclasses as dicts, enums (`RunStatus`) as their value,
    pydantic models by `model_dump`."""
    return to_jsonable_python(value, by_alias=True)


def print_json(value: object) -> None:
    """`value` as indented JSON on stdout (ASCII-only, so any terminal encoding works)."""
    sys.stdout.write(json.dumps(jsonable(value), indent=2, ensure_ascii=True) + "\n")


def print_result(as_json: bool, result: object, line: str) -> None:
    """A write command's result: `line` for people, or `result` as JSON (`--json`)."""
    if as_json:
        print_json(result)
    else:
        print(line)


def table(*columns: str, title: str | None = None) -> Table:
    """A table for people: a header row, no borders between rows."""
    t = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False,
              show_edge=False)
    for column in columns:
        t.add_column(column, overflow="fold")
    return t


def when(timestamp: float | None) -> str:
    """A time (seconds since the epoch) in UTC, to the second; '-' for None."""
    if timestamp is None:
        return "-"
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def age(seconds: float | None) -> str:
    """A duration for people: '4.2 s', '3 min', '5.1 h', '2.0 d'; '-' for None."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def printable(text: str) -> str:
    r"""`text` with each control character as its escape: `"a\x1b[2J"` -> `"a\\x1b[2J"`."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def cells(values: Sequence[object]) -> list[str]:
    """Table cells: None as '-', everything else by `str`, `printable`."""
    return ["-" if v is None else printable(str(v)) for v in values]
