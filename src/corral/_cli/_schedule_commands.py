"""`corral schedule`: create, list, show, pause, resume, trigger, backfill and delete
schedules (`rt.schedules`). Times are ISO 8601 with a zone (`2026-12-06T09:00:00Z`) or
epoch seconds; a spec is `--cron "SEC MIN HOUR DOM MON DOW"` (with `--time-zone`) or
`--every SECONDS` (with `--offset`)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

import typer

import corral
from corral._errors import InvalidArgumentError
from corral.actors import HandlerKind

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
from ._entities import handler_named
from ._failure import guard
from ._groups import ListUnlessNamed
from ._input import PayloadOption
from ._output import cells, out, print_json, table, when

__all__ = ["commands"]

commands = typer.Typer(
    cls=ListUnlessNamed, name="schedule", add_completion=False,
    help="Schedules: entities signalled on a calendar. Without a subcommand: list.")

_Id = Annotated[str, typer.Argument(metavar="ID", help="The schedule's id.",
                                    show_default=False)]


def _time(text: str | None, option: str) -> float | None:
    """An option's time: ISO 8601 with a zone, or epoch seconds."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidArgumentError(f"{option} {text!r:.80}: not an ISO 8601 time or epoch "
                                   "seconds") from None
    if parsed.tzinfo is None:
        raise InvalidArgumentError(f"{option} {text!r:.80}: give a zone (Z or +HH:MM)")
    return parsed.timestamp()


def _spec(cron: str | None, time_zone: str, every: int | None, offset: int
          ) -> corral.Cron | corral.Interval:
    if (cron is None) == (every is None):
        raise InvalidArgumentError("give one spec: --cron EXPR or --every SECONDS")
    try:
        if cron is not None:
            return corral.Cron(cron, time_zone=time_zone)
        assert every is not None
        return corral.Interval(every=every, offset=offset)
    except ValueError as err:
        raise InvalidArgumentError(f"bad spec: {err}") from None


def _row(info: corral.ScheduleInfo) -> list[str]:
    s = info.schedule
    a = s.action
    spec = s.spec.model_dump(exclude={"kind"})
    last = info.outcomes[0].outcome if info.outcomes else None
    return cells([info.id, f"{a.entity_type} {a.key}", a.signal,
                  " ".join(f"{k}={v}" for k, v in spec.items()),
                  "paused" if s.paused else "active",
                  when(info.next_ticks[0]) if info.next_ticks else None,
                  info.fired, info.skipped, last])


def _print(infos: list[corral.ScheduleInfo], as_json: bool) -> None:
    if as_json:
        print_json(infos)
        return
    if not infos:
        out().print("no schedules")
        return
    rows = table("ID", "TARGET", "SIGNAL", "SPEC", "STATE", "NEXT", "FIRED", "SKIPPED",
                 "LAST")
    for info in infos:
        rows.add_row(*_row(info))
    out().print(rows)


@commands.command("create")
def create(
    ctx: typer.Context,
    store: StoreOption,
    app: AppOption,
    schedule_id: _Id,
    entity_type: TypeArgument,
    key: KeyArgument,
    handler: Annotated[str, typer.Argument(metavar="SIGNAL", help="The signal handler.",
                                           show_default=False)],
    payload: PayloadOption = None,
    start: Annotated[str | None, typer.Option(
        "--start", metavar="JSON|@FILE|-",
        help="Each tick is a signal-with-start with this start input (null for a type "
             "whose __init__ takes none); without it a plain signal.")] = None,
    cron: Annotated[str | None, typer.Option(
        "--cron", metavar="EXPR", help="Six cron fields, seconds first.")] = None,
    time_zone: Annotated[str, typer.Option("--time-zone", help="The cron's IANA zone.")
                         ] = "UTC",
    every: Annotated[int | None, typer.Option(
        "--every", metavar="SECONDS", help="An interval spec.")] = None,
    offset: Annotated[int, typer.Option("--offset", metavar="SECONDS",
                                        help="The interval's offset.")] = 0,
    overlap: Annotated[corral.Overlap, typer.Option(
        "--overlap", help="While the previous tick's signal is not applied.")
        ] = corral.Overlap.SKIP,
    catchup_window: Annotated[float, typer.Option(
        "--catchup-window", metavar="SECONDS",
        help="Missed ticks at most this old fire on return.")] = 300.0,
    jitter: Annotated[float, typer.Option("--jitter", metavar="SECONDS")] = 0.0,
    end_at: Annotated[str | None, typer.Option("--end-at", metavar="TIME")] = None,
    max_ticks: Annotated[int | None, typer.Option("--max-ticks")] = None,
    note: Annotated[str, typer.Option("--note")] = "",
    paused: Annotated[bool, typer.Option("--paused", help="Create it paused.")] = False,
    sender: SenderOption = None,
    as_json: JsonFlag = False,
    shards: ShardsOption = None,
) -> None:
    """Create a schedule signalling TYPE KEY's SIGNAL on each tick of its spec."""
    connection = Connection(store, app, shards)
    with guard(ctx):  # bad input never reaches the store
        data = connection.payload(payload)
        start_input = connection.payload(start, "--start")
        spec = _spec(cron, time_zone, every, offset)
        end = _time(end_at, "--end-at")

    async def work(rt: corral.Runtime) -> corral.ScheduleInfo:
        ref = rt.ref(entity_class(rt, entity_type), key)
        signal = handler_named(ref.definition, handler, HandlerKind.SIGNAL)
        extra: dict[str, Any] = {} if start is None else {"start": start_input}
        return await rt.schedules.create(
            schedule_id, ref, signal, data, spec=spec, overlap=overlap,
            catchup_window=catchup_window, jitter=jitter, end_at=end, max_ticks=max_ticks,
            note=note, paused=paused, sender=sender, **extra)

    _print([connection.call(ctx, work)], as_json)


@commands.command("ls")
def list_schedules(
    ctx: typer.Context,
    store: StoreOption,
    app: AppOption,
    after: Annotated[str, typer.Option("--after", metavar="ID",
                                       help="Ids after this one (the next page).")] = "",
    limit: Annotated[int, typer.Option("--limit", help="At most this many.")] = 100,
    sender: SenderOption = None,
    as_json: JsonFlag = False,
    shards: ShardsOption = None,
) -> None:
    """List schedules by id, with their next tick and last outcome."""
    found = Connection(store, app, shards).call(
        ctx, lambda rt: rt.schedules.list(after=after, limit=limit, sender=sender))
    _print(found, as_json)


@commands.command("show")
def show(ctx: typer.Context, store: StoreOption, app: AppOption, schedule_id: _Id,
         sender: SenderOption = None, as_json: JsonFlag = False,
         shards: ShardsOption = None) -> None:
    """Show a schedule: its definition, next ticks and newest outcomes."""
    info = Connection(store, app, shards).call(
        ctx, lambda rt: rt.schedules.describe(schedule_id, sender=sender))
    if as_json:
        print_json(info)
        return
    _print([info], False)
    out().print("next ticks: " + ", ".join(when(t) for t in info.next_ticks) or "-")
    if info.schedule.note:
        out().print(f"note: {info.schedule.note}")
    rows = table("AT", "TICK", "OUTCOME", "DETAIL", "MESSAGE ID", title="outcomes")
    for o in info.outcomes:
        rows.add_row(*cells([when(o.at), o.tick, o.outcome, o.detail, o.message_id]))
    out().print(rows)


def _simple(verb: str, doc: str) -> None:
    def command(ctx: typer.Context, store: StoreOption, app: AppOption, schedule_id: _Id,
                sender: SenderOption = None, as_json: JsonFlag = False,
                shards: ShardsOption = None) -> None:
        async def work(rt: corral.Runtime) -> Any:
            call = getattr(rt.schedules, verb)
            return await call(schedule_id, sender=sender)
        done = Connection(store, app, shards).call(ctx, work)
        if as_json:
            print_json(done)
        elif isinstance(done, corral.ScheduleInfo):
            _print([done], False)
        elif isinstance(done, corral.BackfillResult):
            print(f"{verb} {schedule_id}: {', '.join(done.outcomes)}")
        else:
            print(f"deleted {schedule_id}" if done else f"no schedule {schedule_id}")
    command.__doc__ = doc
    commands.command(verb)(command)


_simple("pause", "Pause a schedule: ticks due while paused are skipped.")
_simple("resume", "Resume a schedule from its first tick after now.")
_simple("trigger", "Deliver a schedule's action now, once.")
_simple("delete", "Delete a schedule (its delivered ticks stay delivered).")


@commands.command("backfill")
def backfill(ctx: typer.Context, store: StoreOption, app: AppOption, schedule_id: _Id,
             start: Annotated[str, typer.Argument(metavar="START", help="ISO time or epoch.")],
             end: Annotated[str, typer.Argument(metavar="END", help="ISO time or epoch.")],
             sender: SenderOption = None, as_json: JsonFlag = False,
             shards: ShardsOption = None) -> None:
    """Deliver the ticks from START to END (both included), each once: a tick that
    fired before is answered duplicate."""
    with guard(ctx):
        first, last = _time(start, "START"), _time(end, "END")
    assert first is not None
    assert last is not None
    done = Connection(store, app, shards).call(
        ctx, lambda rt: rt.schedules.backfill(schedule_id, first, last, sender=sender))
    if as_json:
        print_json(done)
    else:
        print(f"backfilled {schedule_id}: {done.delivered} delivered, "
              f"{len(done.outcomes) - done.delivered} not (duplicate or refused)")
