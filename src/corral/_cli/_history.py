"""`corral history` and `corral show --state`: what an entity went through, and what is
in it now (`EntityRef.history`, `EntityRef.state`), read from the store.

A table is for people: a payload, start input or result in a cell is cut at
`_CELL_CHARS` characters and the state at `_STATE_CHARS` (each with a note saying so),
so rich never lays out megabytes (a 20 MB state took 47 s as a table); `--json` prints
everything whole.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from rich.table import Table

import corral

from ._connection import (
    AppOption,
    Connection,
    JsonFlag,
    KeyArgument,
    SenderOption,
    ShardsOption,
    StoreOption,
    TypeArgument,
    entity_class,
)
from ._output import cells, out, print_json, printable, table, when

__all__ = ["After", "Limit", "entity_history", "print_state"]

_CELL_CHARS = 200  # of a value's JSON in a table cell
_STATE_CHARS = 20_000  # of the state's indented JSON under `show --state`
_MAILBOX_SHOWN = 20  # mailbox payloads listed under `show --state`

Limit = Annotated[int, typer.Option("--limit", help="At most this many messages.")]
After = Annotated[str | None, typer.Option(
    "--after", metavar="CURSOR", help="The next page of messages: the cursor the last page "
    "printed.")]


def _compact(value: Any) -> str:
    """JSON data on one line (None: '-'), cut at `_CELL_CHARS` characters."""
    if value is None:
        return "-"
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if len(text) <= _CELL_CHARS:
        return text
    return f"{text[:_CELL_CHARS]}... ({len(text):,} characters: --json prints it whole)"


def entity_history(
    ctx: typer.Context,
    store: StoreOption,
    app: AppOption,
    entity_type: TypeArgument,
    key: KeyArgument,
    limit: Limit = 100,
    after: After = None,
    sender: SenderOption = None,
    as_json: JsonFlag = False,
    shards: ShardsOption = None,
) -> None:
    """List an entity's runs (start input, result or error), its messages oldest first
    (accepted, applied or dead-lettered, with ids, senders and times; a page at a time),
    its signal waits, its pending timers and its durable steps (attempts, duration,
    outcome, where each ran; `--json` adds each failed step's traceback).

    A message's name and payload are kept until a snapshot covers it: after that the
    dedupe window still shows its id, sender and time (until it forgets it).
    """
    found = Connection(store, app, shards).call(
        ctx, lambda rt: rt.ref(entity_class(rt, entity_type), key).history(
            limit=limit, after=after, sender=sender))
    if as_json:
        print_json(found)
        return
    console = out()
    applied = "-" if found.applied_seq is None else str(found.applied_seq)
    console.print(printable(f"{found.entity_type} {found.key!r}: {found.status.value}, "
                            f"run {found.run_id}, applied seq {applied}"))
    runs = table("RUN", "STATUS", "STARTED", "CLOSED", "START INPUT", "RESULT", "ERROR",
                 title="runs")
    for r in found.runs:
        error = (r.error or "").strip().splitlines()
        runs.add_row(*cells([r.run_id, r.status.value, when(r.started_at), when(r.closed_at),
                             _compact(r.start_input), _compact(r.result),
                             error[-1] if error else None]))
    console.print()
    console.print(runs)
    console.print()
    _messages(found.messages.items, "messages", dead=True)
    if found.waits:
        waits = table("RUN", "WAIT", "STATUS", "OPENED", "DEADLINE", "DELIVERY KEY", "SENDER",
                      "DELIVERED", title="waits")
        for w in found.waits:
            waits.add_row(*cells([w.run_id, w.name, w.status.value, when(w.opened_at),
                                  when(w.deadline), w.delivery_key, w.sender,
                                  when(w.delivered_at)]))
        console.print()
        console.print(waits)
    if found.timers:
        timers = table("RUN", "TIMER", "DUE", title="timers")
        for t in found.timers:
            timers.add_row(*cells([t.run_id, t.timer_id, when(t.due_at)]))
        console.print()
        console.print(timers)
    if found.steps:
        console.print()
        console.print(_steps(found.steps))
    if found.messages.next_cursor is not None:
        console.print(f"more: --after {found.messages.next_cursor}")


def _steps(steps: Sequence[corral.StepInfo]) -> Table:
    """The steps table: a result cut at `_CELL_CHARS`, an error's last line (`--json`
    prints the whole error and its traceback)."""
    rows = table("RUN", "STEP", "STATUS", "ATTEMPTS", "STARTED", "DURATION", "RAN",
                 "RESULT", "LAST ERROR", title="steps")
    for s in steps:
        ran = (f"ray task {s.node}" if s.node else "ray task") if s.ray_task else "host"
        error = (s.error or "").strip().splitlines()
        result = None if s.result is None else \
            s.result if len(s.result) <= _CELL_CHARS else f"{s.result[:_CELL_CHARS]}..."
        rows.add_row(*cells([s.run_id, s.name, s.status, s.attempts, when(s.started_at),
                             f"{s.duration:.3f} s", ran, result,
                             error[-1] if error else None]))
    return rows


def _messages(items: Sequence[corral.MessageInfo], title: str, *, dead: bool) -> None:
    console = out()
    if not items:
        console.print(f"no {title}")
        return
    columns = ["SEQ", "RUN", "KIND", "NAME", "STATUS", "MESSAGE ID", "SENDER", "ACCEPTED",
               "PAYLOAD"] + (["DEAD LETTER"] if dead else [])
    rows = table(*columns, title=title)
    for m in items:
        letter = [] if not dead else [
            None if m.dead_letter_id is None else f"{m.dead_letter_id}: {m.error}"]
        rows.add_row(*cells([m.seq, m.run_id, m.kind, m.name, m.status, m.message_id,
                             m.sender, when(m.accepted_at),
                             None if m.kind is None else _compact(m.payload), *letter]))
    console.print(rows)


def print_state(state: corral.EntityState, *, as_json: bool) -> None:
    """`show --state`: the snapshot's state as JSON, its mailbox, the messages after it."""
    if as_json:
        print_json(state)
        return
    console = out()
    console.print()
    if state.snapshot_seq is None:
        console.print("state: no snapshot yet (the messages below are the whole run)")
    else:
        console.print(f"state at seq {state.snapshot_seq} (state version "
                      f"{state.state_version}):")
        text, whole = _head(state.state)
        console.print("\n".join(printable(line) for line in text.splitlines()))
        if not whole:
            console.print(f"... (the first {_STATE_CHARS:,} characters: --state --json "
                          "prints the whole state)")
    if state.mailbox:
        console.print(f"mailbox: {len(state.mailbox)} payload(s) not taken by run() yet")
        for item in state.mailbox[:_MAILBOX_SHOWN]:
            console.print(printable(_compact(item)))
        if len(state.mailbox) > _MAILBOX_SHOWN:
            console.print(f"... ({len(state.mailbox) - _MAILBOX_SHOWN} more: --state --json "
                          "lists them all)")
    console.print()
    _messages(state.pending.items, "messages after the snapshot", dead=False)
    if state.pending.next_cursor is not None:
        console.print(f"more: --state --after {state.pending.next_cursor}")


def _head(value: Any) -> tuple[str, bool]:
    """The first `_STATE_CHARS` characters of `value` as indented JSON, and whether that
    is all of it: encoded lazily, so a 20 MB state costs what its head does."""
    chunks: list[str] = []
    size = 0
    for chunk in json.JSONEncoder(indent=2, ensure_ascii=False).iterencode(value):
        chunks.append(chunk)
        size += len(chunk)
        if size > _STATE_CHARS:
            return "".join(chunks)[:_STATE_CHARS], False
    return "".join(chunks), True
