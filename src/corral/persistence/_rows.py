"""Decoding what a row holds, for every read: stored JSON and column values.

A row is input like any other: SQLite keeps any value in any column, and either store
holds what was written into it by hand. What does not decode (JSON that does not
parse or is nested too deeply, a status or entry kind no corral writes, a time that is
not a number) raises `CorruptRowError` naming the row's entity, table and column:
never a bare `ValueError`, `KeyError` or `RecursionError`, and never a `StoreError`
(asking again gives the same row, so nothing must retry it).

`Row` names the row once (`Row("journal", etype, key, run_id=3, what="seq 7")`) and
decodes its columns; `stored_json` is the one decoder of stored JSON text.
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass
from typing import Any, TypeVar

from corral._errors import CorruptRowError

__all__ = ["STORED_MAX_DEPTH", "Row", "nested_deeper_than", "shown", "stored_json"]

E = TypeVar("E", bound=enum.Enum)


@dataclass(frozen=True, slots=True)
class Row:
    """One stored row, named for the errors its columns may raise.

    Attributes:
        table: the table it is in.
        entity_type, key, run_id: whose row it is (None where it is no entity's).
        what: what else tells it apart in the message ("seq 7", "build 1a2b").
    """

    table: str
    entity_type: str | None = None
    key: str | None = None
    run_id: int | None = None
    what: str = ""

    def corrupt(self, column: str, why: str) -> CorruptRowError:
        """The error for `column` of this row, saying `why` it does not decode."""
        whose = " ".join(p for p in (
            self.entity_type, None if self.key is None else repr(self.key),
            None if self.run_id is None else f"run {self.run_id}", self.what) if p)
        return CorruptRowError(
            f"{whose + ': ' if whose else ''}the stored {self.table}.{column} {why}; the row "
            "was damaged or written by hand (no corral writes it): fix or delete it",
            table=self.table, column=column, entity_type=self.entity_type, key=self.key,
            run_id=self.run_id)

    def json(self, column: str, text: str | bytes | None) -> Any:
        """`stored_json` of `column` (None stays None)."""
        return None if text is None else stored_json(text, self, column)

    def enum(self, column: str, kind: type[E], value: object) -> E:
        """`value` as a member of `kind` (by value)."""
        try:
            return kind(value)
        except ValueError:
            names = ", ".join(str(m.value) for m in kind)
            raise self.corrupt(column, f"is {shown(value)}, not one of {names}") from None

    def seconds(self, column: str, value: object) -> float:
        """A time or duration in seconds: a finite number (an int or a float)."""
        if isinstance(value, int | float) and not isinstance(value, bool) \
                and math.isfinite(value):
            return float(value)
        raise self.corrupt(column, f"is {shown(value)}, not a number of seconds")

    def maybe_seconds(self, column: str, value: object) -> float | None:
        """`seconds`, or None for NULL."""
        return None if value is None else self.seconds(column, value)

    def integer(self, column: str, value: object) -> int:
        """A whole number (a seq, a count, an id)."""
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise self.corrupt(column, f"is {shown(value)}, not a whole number")

    def maybe_integer(self, column: str, value: object) -> int | None:
        """`integer`, or None for NULL."""
        return None if value is None else self.integer(column, value)

    def text(self, column: str, value: object) -> str:
        """Text (SQLite TEXT, PostgreSQL text); bytes or a number are refused, as no
        corral writes them there."""
        if isinstance(value, str):
            return value
        raise self.corrupt(column, f"is {type(value).__name__}, not text")

    def blob(self, column: str, value: object) -> bytes:
        """Bytes (SQLite BLOB, PostgreSQL bytea); text is refused, as no corral
        writes it there."""
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        raise self.corrupt(column, f"is {type(value).__name__}, not bytes")


STORED_MAX_DEPTH = 255  # pydantic serializes no deeper: corral never stored more


def stored_json(text: str | bytes, row: Row, column: str) -> Any:
    """The JSON value of stored text: what every read of stored JSON goes through (a
    run's start input and result, a payload, a snapshot, a build's manifest).

    The standard library's parser reads it (any integer, as written); what it cannot
    read is `CorruptRowError`: not JSON, not UTF-8, or nested deeper than
    `STORED_MAX_DEPTH` levels. No corral wrote that (a payload is refused past
    `MAX_DEPTH` levels at the boundary, and pydantic encodes no state deeper), and
    nothing downstream could use it: pydantic refuses to encode it again. The bound is
    corral's own, not the parser's (which gives up near a thousand levels before Python
    3.12 and goes deeper after).
    """
    try:
        value = json.loads(text)
    except RecursionError:
        raise row.corrupt(column, "is JSON nested too deeply to read") from None
    except (ValueError, TypeError) as err:  # JSONDecodeError, UnicodeDecodeError
        raise row.corrupt(column, f"is not JSON ({err})") from None
    if nested_deeper_than(value, text, STORED_MAX_DEPTH):
        raise row.corrupt(column, "is JSON nested too deeply to read "
                                  f"(more than {STORED_MAX_DEPTH} levels)")
    return value


def nested_deeper_than(value: Any, text: str | bytes, limit: int) -> bool:
    """Whether `value` (parsed from `text`) nests containers more than `limit` deep.
    A text with no more brackets than `limit` cannot (counted at C speed: the walk is
    paid only by large structured values)."""
    opening = ("[", "{") if isinstance(text, str) else (b"[", b"{")
    if text.count(opening[0]) + text.count(opening[1]) <= limit:  # type: ignore[arg-type]
        return False
    if not isinstance(value, dict | list):
        return False  # the brackets were inside a string
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def shown(value: object) -> str:
    """A value as an error shows it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."
