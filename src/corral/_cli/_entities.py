"""`corral ls`, `corral show` and `corral signal`: entities, one entity, and a signal
sent to one."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

import corral
from corral._errors import EntityNotRunningError, UnknownHandlerError
from corral.actors import EntityDefinition, HandlerKind

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
from ._failure import guard
from ._history import After, Limit, print_state
from ._input import PayloadOption
from ._output import (
    age,
    cells,
    out,
    print_json,
    print_result,
    printable,
    table,
    when,
)

__all__ = ["ack_line", "handler_named", "list_entities", "send_signal", "show_entity"]


def list_entities(
    ctx: typer.Context,
    store: StoreOption,
    app: AppOption,
    entity_type: Annotated[str | None, typer.Argument(
        metavar="TYPE", help="Only entities of this type.", show_default=False)] = None,
    status: Annotated[str | None, typer.Option(
        "--status", metavar="STATUS",
        help="Only entities whose latest run has this status: running, completed, failed, "
             "terminated or continued.")] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many.")] = 100,
    after: Annotated[str | None, typer.Option(
        "--after", metavar="CURSOR", help="The next page: the cursor the last page printed.")
        ] = None,
    sender: SenderOption = None,
    as_json: JsonFlag = False,
    shards: ShardsOption = None,
) -> None:
    """List entities in (type, key) order, a page at a time."""
    page = Connection(store, app, shards).call(
        ctx, lambda rt: rt.entities(entity_type, status=status, limit=limit, after=after,
                                    sender=sender))
    if as_json:
        print_json(page)
        return
    console = out()
    if not page.items and not page.unreadable:
        console.print("no entities")
    else:
        rows = table("TYPE", "KEY", "STATUS", "RUN", "ACCEPTED", "APPLIED", "BACKLOG",
                     "OLDEST UNAPPLIED", "PASSIVATED", "UPDATED", "SHARD")
        for e in page.items:
            status = f"{e.status.value} (suspended)" if e.suspended else e.status.value
            rows.add_row(*cells([e.entity_type, e.key, status, e.run_id,
                                 e.accepted_seq, e.applied_seq, e.backlog,
                                 _waited(e.oldest_unapplied_age),
                                 "yes" if e.passivated else "no", when(e.updated_at),
                                 e.shard]))
        console.print(rows)
    for unreadable in page.unreadable:  # left out of the table: named, never fatal
        console.print(printable(f"unreadable (left out): {unreadable}"), markup=False,
                      highlight=False)
    if page.next_cursor is not None:
        console.print(f"more: --after {page.next_cursor}")


def show_entity(
    ctx: typer.Context,
    store: StoreOption,
    app: AppOption,
    entity_type: TypeArgument,
    key: KeyArgument,
    state: Annotated[bool, typer.Option(
        "--state", help="Also the latest snapshot's state as JSON and the messages accepted "
        "after it, with their payloads (--json: only that, whole; the table cuts the state "
        "at 20,000 characters and each payload at 200).")] = False,
    limit: Limit = 100,
    after: After = None,
    sender: SenderOption = None,
    as_json: JsonFlag = False,
    shards: ShardsOption = None,
) -> None:
    """Describe one entity: status, progress, runs, snapshot, timers, open waits, dead
    letters; with --state, what is in it.

    The applied position, backlog and mailbox depth are as the entity's host last
    recorded them in the store (at most a second or so behind the host).
    """
    async def read(rt: corral.Runtime) -> tuple[corral.EntityDescription,
                                                 corral.EntityState | None]:
        ref = rt.ref(entity_class(rt, entity_type), key)
        described = await ref.describe(sender=sender)
        if not state or described.status is corral.RunStatus.NEVER_STARTED:
            return described, None
        return described, await ref.state(limit=limit, after=after, sender=sender)

    found, contents = Connection(store, app, shards).call(ctx, read)
    if as_json:
        print_json(found if contents is None else contents)
        return
    console = out()
    console.print(_facts(found))
    if found.suspension is not None:  # the bug to fix: its whole traceback
        console.print()
        console.print("suspended by:", style="bold")  # the console reads no markup
        for line in found.suspension.error.rstrip().splitlines():
            console.print(printable(line), markup=False, highlight=False)
    if found.runs:
        runs = table("RUN", "STATUS", "STARTED", "CLOSED", "CONTINUED FROM", "ERROR",
                     title="runs")
        for r in found.runs:
            error = (r.error or "").strip().splitlines()
            runs.add_row(*cells([r.run_id, r.status.value, when(r.started_at),
                                 when(r.closed_at), r.continued_from,
                                 error[-1] if error else None]))
        console.print()
        console.print(runs)
    if found.open_waits:
        waits = table("WAIT", "RUN", "WAITING SINCE", "DEADLINE", title="open waits")
        for w in found.open_waits:
            waits.add_row(*cells([w.name, w.run_id, when(w.waiting_since), when(w.deadline)]))
        console.print()
        console.print(waits)
    if contents is not None:
        print_state(contents, as_json=False)


def _facts(d: corral.EntityDescription) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    snapshot = "none" if d.snapshot_seq is None else \
        f"at seq {d.snapshot_seq}, taken {age(d.snapshot_age)} ago"
    timers = "none" if not d.timers else \
        f"{len(d.timers)}, the next due {when(min(d.timers))}"
    s = d.suspension
    suspended = [] if s is None else [(
        "suspended", f"{s.attempts} failed attempt{'' if s.attempts == 1 else 's'} since "
                     f"{when(s.since)}, the next at {when(s.next_attempt_at)}")]
    for name, value in [
        ("entity", f"{d.entity_type} {d.key!r} (shard {d.shard})"),
        ("status", d.status.value if s is None else f"{d.status.value} (suspended)"),
        *suspended,
        ("run", "-" if d.run_id == 0 else str(d.run_id)),
        ("accepted seq", str(d.accepted_seq)),
        ("applied seq", "-" if d.applied_seq is None else str(d.applied_seq)),
        ("backlog", _backlog(d)),
        ("mailbox depth", "-" if d.mailbox_depth is None else str(d.mailbox_depth)),
        ("progress", "live here" if d.hosted_here else
         "never recorded" if d.progress_age is None else
         f"recorded by its host {age(d.progress_age)} ago"),
        ("snapshot", snapshot),
        ("timers", timers),
        ("open waits", str(len(d.open_waits))),
        ("dead letters", str(d.dead_letters)),
    ]:
        grid.add_row(name, printable(value))
    return grid


def _waited(seconds: float | None) -> str | None:
    return None if seconds is None else f"{age(seconds)} ago"


def _backlog(d: corral.EntityDescription) -> str:
    """"3 messages, the oldest accepted 12s ago" (or "-" for an entity never started)."""
    if d.backlog is None:
        return "-"
    text = f"{d.backlog} message{'' if d.backlog == 1 else 's'}"
    oldest = _waited(d.oldest_unapplied_age)
    return text if oldest is None else f"{text}, the oldest accepted {oldest}"


def send_signal(
    ctx: typer.Context,
    store: StoreOption,
    app: AppOption,
    entity_type: TypeArgument,
    key: KeyArgument,
    handler: Annotated[str, typer.Argument(
        metavar="HANDLER", help="The signal handler's name.", show_default=False)],
    message_id: Annotated[str, typer.Option(
        "--message-id", metavar="ID",
        help="The message's idempotency key: the same command again is answered duplicate.",
        show_default=False)],
    payload: PayloadOption = None,
    start: Annotated[str | None, typer.Option(
        "--start", metavar="JSON|@FILE|-",
        help="Signal-with-start: start a run first if none is running, with this start "
             "input (null for a type whose __init__ takes none).")] = None,
    sender: SenderOption = None,
    as_json: JsonFlag = False,
    shards: ShardsOption = None,
) -> None:
    """Send a signal to an entity (with --start: starting a run if none is running).

    Without --start the signal goes to the running run (EntityNotRunningError if there
    is none); with it, a run is started first if none is running, atomically. Prints
    the acknowledgement, e.g. "accepted run 1 seq 3 (started)"; a message id sent
    before is answered "duplicate" with the original position.
    """
    connection = Connection(store, app, shards)
    with guard(ctx):  # bad JSON never reaches the store
        data, start_input = connection.payload(payload), connection.payload(start, "--start")

    async def send(rt: corral.Runtime) -> corral.Ack:
        ref = rt.ref(entity_class(rt, entity_type), key)
        signal = handler_named(ref.definition, handler, HandlerKind.SIGNAL)
        if start is None:
            try:
                return await ref.signal(signal, data, message_id=message_id, sender=sender)
            except EntityNotRunningError as err:
                raise EntityNotRunningError(
                    f"{err} (--start JSON starts one)", entity_type=err.entity_type,
                    key=err.key, run_id=err.run_id, message_id=err.message_id) from err
        return await ref.signal_with_start(signal, data, start=start_input,
                                           message_id=message_id, sender=sender)

    ack = connection.call(ctx, send)
    print_result(as_json, ack, ack_line(ack))


_PLURAL = {HandlerKind.SIGNAL: "signals", HandlerKind.UPDATE: "updates",
           HandlerKind.QUERY: "queries"}


def handler_named(definition: EntityDefinition, name: str, kind: HandlerKind) -> Any:
    """The `kind` handler `name` of the type, as its class declares it (an old name given
    by `renamed_from=` finds the handler under today's name).

    Raises:
        UnknownHandlerError: the type declares no handler of that kind and name.
    """
    declared = definition.handler(name)
    if declared is None or declared.kind is not kind:
        handlers = sorted(n for n, h in definition.handlers.items() if h.kind is kind)
        what = f"no such {kind.value}" if declared is None else \
            f"{declared.kind.value} handler, not a {kind.value}"
        raise UnknownHandlerError(
            f"{definition.name}.{name}: {what} (its {_PLURAL[kind]}: {handlers})",
            entity_type=definition.name)
    return getattr(definition.cls, declared.name)


def ack_line(ack: corral.Ack) -> str:
    """'accepted run 1 seq 3 (started)'."""
    return f"{ack.status} run {ack.run_id} seq {ack.seq}" + (" (started)" if ack.started else "")
