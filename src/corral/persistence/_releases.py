"""Declared releases of a deployment: the store's durable record of what it runs.

A *release* is what an operator declared a deployment (a Ray namespace) runs: the
runtime above the store decides what it holds and the store keeps it as opaque JSON
text (`body`), numbered per namespace by `seq` (1, 2, ...) in the order declared. The
namespace's current release is its newest row; a rollback is a new declaration of an
older release's id, so it gets a new seq and the history reads as it happened.

Declaring (`DeclareReleaseOp`) reads the newest row and appends after it in one
transaction, serialised with every other declaration as the registry of builds'
checked registrations are (`LockPlan.registry`: SQLite's write lock, PostgreSQL's
advisory lock), so two declarations at once get two seqs and a declaration of the
current release again writes nothing. The oldest rows past `KEPT_RELEASES` per
namespace are pruned by the declaration that passes them.

Every argument is checked before anything is written (`check_declaration`,
`InvalidArgumentError`); a row that does not decode is a `CorruptRowError` naming it
(`Row`). A damaged newest row is never "the same" release: declaring again appends a
readable one after it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from corral._errors import CorruptRowError, InvalidArgumentError

from ._rows import STORED_MAX_DEPTH, Row, nested_deeper_than, shown
from ._txn import LockPlan, Txn

__all__ = ["KEPT_RELEASES", "MAX_RELEASE_BODY", "DeclareReleaseOp", "ReleaseRecord",
           "ReleaseRegistry", "check_declaration", "check_limit", "check_namespace",
           "releases"]

KEPT_RELEASES = 50
"""Releases kept per namespace: a declaration prunes the older ones."""
MAX_RELEASE_BODY = 2**20
"""The largest release body, in bytes of UTF-8."""

# The rule of `corral.runtime.client._options.check_namespace`: the namespace names the
# Ray namespace and every actor of the deployment.
_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_RELEASE_ID = re.compile(r"[!-~]{1,128}")  # printable ASCII, no space
_MAX_DECLARED_BY = 256
_COLUMNS = "seq, release_id, body, declared_at, declared_by"


@dataclass(frozen=True, slots=True)
class ReleaseRecord:
    """One declared release of a namespace, as stored.

    Attributes:
        namespace: the deployment it belongs to (a Ray namespace).
        seq: its place in the namespace's history, from 1; the newest is current.
        release_id: what identifies the release (a rollback declares an older one's id
            again, under a new seq).
        body: the release as JSON object text, written and read by the runtime; the
            store keeps it as given.
        declared_at: when it was declared, by the store's clock (epoch seconds).
        declared_by: who declared it, for people ("alice@build-7 (corral deploy)").
    """

    namespace: str
    seq: int
    release_id: str
    body: str
    declared_at: float
    declared_by: str


class ReleaseRegistry(Protocol):
    """The store's role for declared releases (see the module docstring)."""

    async def declare_release(self, namespace: str, release_id: str, body: str, *,
                              declared_by: str) -> ReleaseRecord:
        """Make `release_id` (described by `body`, JSON object text) the current release
        of `namespace`: appended as the next seq, unless it is the current release
        already (then that row is returned and nothing is written).

        Raises:
            InvalidArgumentError: a malformed argument; nothing is stored.
            CorruptRowError: the newest row's seq does not decode (nothing can follow it).
        """
        ...

    async def releases(self, namespace: str, *, limit: int = 10) -> list[ReleaseRecord]:
        """The namespace's newest `limit` releases, newest (the current) first.

        Raises:
            InvalidArgumentError: a malformed namespace or limit.
            CorruptRowError: one of those rows does not decode (never left out: the
                current release is never silently an older one).
        """
        ...


def check_namespace(namespace: object) -> str:
    """A deployment's namespace: 1-64 letters, digits, '.', '_' or '-', starting with a
    letter or digit."""
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise InvalidArgumentError(
            "namespace must be 1-64 letters, digits, '.', '_' or '-' (starting with a "
            f"letter or digit), got {shown(namespace)}")
    return namespace


def check_declaration(namespace: object, release_id: object, body: object,
                      declared_by: object) -> None:
    """Refuse a malformed declaration (`InvalidArgumentError` naming the argument)."""
    check_namespace(namespace)
    if not isinstance(release_id, str) or not _RELEASE_ID.fullmatch(release_id):
        raise InvalidArgumentError(
            "release_id must be 1-128 printable ASCII characters without spaces, got "
            f"{shown(release_id)}")
    if not isinstance(declared_by, str) or not 0 < len(declared_by) <= _MAX_DECLARED_BY \
            or not declared_by.isprintable():
        raise InvalidArgumentError(
            f"declared_by must be 1-{_MAX_DECLARED_BY} printable characters, got "
            f"{shown(declared_by)}")
    _check_body(body)


def _check_body(body: object) -> None:
    if not isinstance(body, str):
        raise InvalidArgumentError(f"a release body must be JSON text, got {shown(body)}")
    if len(body) > MAX_RELEASE_BODY or _utf8_size(body) > MAX_RELEASE_BODY:
        raise InvalidArgumentError(
            f"a release body must be at most {MAX_RELEASE_BODY} bytes of UTF-8, got "
            f"{_utf8_size(body)}")
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        value = None
    except ValueError as err:
        raise InvalidArgumentError(f"a release body must be JSON text ({err})") from None
    if not isinstance(value, dict) or nested_deeper_than(value, body, STORED_MAX_DEPTH):
        raise InvalidArgumentError(
            "a release body must be a JSON object nested at most "
            f"{STORED_MAX_DEPTH} levels, got {shown(body)}")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _utf8_size(text: str) -> int:
    """`text`'s size in UTF-8; `InvalidArgumentError` for a lone surrogate (no UTF-8)."""
    try:
        return len(text.encode())
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{shown(text)} holds a lone surrogate, not UTF-8 text"
                                   ) from None


def check_limit(limit: object) -> int:
    """`releases(limit=)`: a whole number >= 1."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise InvalidArgumentError(f"limit must be a whole number >= 1, got {shown(limit)}")
    return limit


def _record(namespace: str, r: Sequence[Any]) -> ReleaseRecord:
    """The release of row `r` (`_COLUMNS`), or `CorruptRowError` naming it."""
    row = Row("releases", what=f"namespace {namespace!r} release seq {shown(r[0])}")
    body = row.text("body", r[2])
    if not isinstance(row.json("body", body), dict):
        raise row.corrupt("body", "is not a JSON object")
    return ReleaseRecord(namespace, row.integer("seq", r[0]), row.text("release_id", r[1]),
                         body, row.seconds("declared_at", r[3]),
                         row.text("declared_by", r[4]))


async def releases(q: Txn, namespace: str, limit: int) -> list[ReleaseRecord]:
    """The namespace's newest `limit` releases, newest first."""
    rows = await q.fetchall(f"SELECT {_COLUMNS} FROM releases WHERE namespace = ? "
                            "ORDER BY seq DESC LIMIT ?", namespace, limit)
    return [_record(namespace, r) for r in rows]


@dataclass(frozen=True, slots=True)
class DeclareReleaseOp:
    """Append `release_id` to `namespace`'s releases unless it is the current one (see
    `ReleaseRegistry.declare_release`); prune past `KEPT_RELEASES`. Checked by
    `check_declaration` before it is queued."""

    namespace: str
    release_id: str
    body: str
    declared_by: str
    buffered: ClassVar[bool] = False

    def plan(self, plan: LockPlan) -> None:
        plan.registry = True  # one declaration at a time reads the newest and appends

    async def apply(self, txn: Txn) -> ReleaseRecord:
        newest = await txn.fetchone(f"SELECT {_COLUMNS} FROM releases WHERE namespace = ? "
                                    "ORDER BY seq DESC LIMIT 1", self.namespace)
        seq = 1
        if newest is not None:
            current = _readable(self.namespace, newest)
            if current is not None and current.release_id == self.release_id:
                return current
            seq = Row("releases", what=f"namespace {self.namespace!r}").integer(
                "seq", newest[0]) + 1
        record = ReleaseRecord(self.namespace, seq, self.release_id, self.body,
                               await txn.clock(), self.declared_by)
        await txn.execute("INSERT INTO releases (namespace, seq, release_id, body, "
                          "declared_at, declared_by) VALUES (?, ?, ?, ?, ?, ?)",
                          self.namespace, seq, self.release_id, self.body,
                          record.declared_at, self.declared_by)
        await txn.execute("DELETE FROM releases WHERE namespace = ? AND seq <= ?",
                          self.namespace, seq - KEPT_RELEASES)
        return record


def _readable(namespace: str, r: Sequence[Any]) -> ReleaseRecord | None:
    """The release of row `r`, or None where it does not decode."""
    try:
        return _record(namespace, r)
    except CorruptRowError:
        return None

