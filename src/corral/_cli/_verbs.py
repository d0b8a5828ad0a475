"""`corral start`, `update`, `query`, `terminate`, `result` and `resume`: the client
API's verbs, one command each, through the same validation and `authorize` hook as the
application (`corral.EntityRef`).

Each takes the payload as `--payload`/`-p` (`_input`) and prints one line, or JSON with
`--json`; a handler's result (`update`, `query`, `result`) is printed as JSON either
way: one compact line, or indented with `--json`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import typer

import corral
from corral._errors import WaitTimeoutError
from corral.actors import HandlerKind
from corral.runtime import QUERY_TIMEOUT

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
from ._entities import ack_line, handler_named
from ._failure import guard
from ._input import PayloadOption
from ._output import jsonable, print_json, print_result, printable

__all__ = ["query_entity", "result_of", "resume_entity", "start_entity", "terminate_entity",
           "update_entity"]

_Handler = Annotated[str, typer.Argument(
    metavar="HANDLER", help="The handler's name, as the class declares it.",
    show_default=False)]
_MessageId = Annotated[str | None, typer.Option(
    "--message-id", metavar="ID",
    help="The idempotency key: the same command again is answered duplicate (default: a "
         "fresh one).", show_default=False)]
_Start = Annotated[str | None, typer.Option(
    "--start", metavar="JSON|@FILE|-",
    help="With start: start a run first if none is running, with this start input (null "
         "for a type whose __init__ takes none).", show_default=False)]


def _print_value(as_json: bool, value: Any) -> None:
    """A handler's result as JSON: indented with --json, else one line."""
    if as_json:
        print_json(value)
    else:
        print(json.dumps(jsonable(value), ensure_ascii=True, separators=(", ", ": ")))


def _acknowledge(ctx: typer.Context, connection: Connection, entity_type: str, key: str,
                 as_json: bool, send: Callable[[Any], Awaitable[corral.Ack]]) -> None:
    """Call `send(ref)` on the entity and print its acknowledgement (`--json`: as JSON)."""
    async def work(rt: corral.Runtime) -> corral.Ack:
        return await send(rt.ref(entity_class(rt, entity_type), key))

    ack = connection.call(ctx, work)
    print_result(as_json, ack, ack_line(ack))


def start_entity(
    ctx: typer.Context,
    store: StoreOption,
    app: AppOption,
    entity_type: TypeArgument,
    key: KeyArgument,
    payload: PayloadOption = None,
    start_id: Annotated[str | None, typer.Option(
        "--start-id", metavar="ID",
        help="The start's idempotency key: the same command again is answered duplicate.",
        show_default=False)] = None,
    sender: SenderOption = None,
    as_json: JsonFlag = False,
    shards: ShardsOption = None,
) -> None:
    """Start a run if none is running, with --payload as its start input, without sending
    a message (a running entity is left as it is). Prints e.g. "accepted run 1 seq 1
    (started)"."""
    connection = Connection(store, app, shards)
    with guard(ctx):
        data = connection.payload(payload)

    _acknowledge(ctx, connection, entity_type, key, as_json,
                 lambda ref: ref.start(start=data, start_id=start_id, sender=sender))


def update_entity(
    ctx: typer.Context,
    store: StoreOption,
    app: AppOption,
    entity_type: TypeArgument,
    key: KeyArgument,
    handler: _Handler,
    payload: PayloadOption = None,
    update_id: Annotated[str | None, typer.Option(
        "--update-id", metavar="ID",
        help="The update's idempotency key: the same command again returns the recorded "
             "result, not a second update.", show_default=False)] = None,
    start: _Start = None,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", metavar="SECONDS", min=0,
        help="Wait at most this long for the result (it stays accepted either way).",
        show_default=False)] = None,
    sender: SenderOption = None,
    as_json: JsonFlag = False,
    shards: ShardsOption = None,
) -> None:
    """Send an update and print its result as JSON (with --start: starting a run first
    if none is running, atomically). The application's hosts apply it: with none
    running, the command waits (see --timeout)."""
    connection = Connection(store, app, shards)
    with guard(ctx):
        data, start_input = connection.payload(payload), connection.payload(start, "--start")

    async def work(rt: corral.Runtime) -> Any:
        ref = rt.ref(entity_class(rt, entity_type), key)
        method = handler_named(ref.definition, handler, HandlerKind.UPDATE)
        if start is None:
            return await ref.update(method, data, update_id=update_id, sender=sender,
                                    timeout=timeout)
        return await ref.update_with_start(method, data, start=start_input,
                                           update_id=update_id, sender=sender,
                                           timeout=timeout)

    _print_value(as_json, connection.call(ctx, work))


def query_entity(
    ctx: typer.Context,
    store: StoreOption,
    app: AppOption,
    entity_type: TypeArgument,
    key: KeyArgument,
    handler: _Handler,
    payload: PayloadOption = None,
    activate: Annotated[bool, typer.Option(
        "--activate",
        help="Bring a passivated entity back into memory (in a host) to answer from live "
             "state, instead of answering from its latest snapshot and journal.")] = False,
    timeout: Annotated[float, typer.Option(
        "--timeout", metavar="SECONDS", min=0,
        help="Wait at most this long for the answer (QueryTimeoutError after).")
    ] = QUERY_TIMEOUT,
    sender: SenderOption = None,
    as_json: JsonFlag = False,
    shards: ShardsOption = None,
) -> None:
    """Run a query handler and print its result as JSON (it changes nothing). The
    application's authorize hook sees it as kind "query"."""
    connection = Connection(store, app, shards)
    with guard(ctx):
        data = connection.payload(payload)

    async def work(rt: corral.Runtime) -> Any:
        ref = rt.ref(entity_class(rt, entity_type), key)
        method = handler_named(ref.definition, handler, HandlerKind.QUERY)
        return await ref.query(method, data, sender=sender, activate=activate,
                               timeout=timeout)

    _print_value(as_json, connection.call(ctx, work))


def terminate_entity(
    ctx: typer.Context,
    store: StoreOption,
    app: AppOption,
    entity_type: TypeArgument,
    key: KeyArgument,
    reason: Annotated[str, typer.Option(
        "--reason", metavar="TEXT", help="Why: recorded as the run's error.")] = "",
    message_id: _MessageId = None,
    sender: SenderOption = None,
    as_json: JsonFlag = False,
    shards: ShardsOption = None,
) -> None:
    """Close the running run as terminated; messages not applied yet are dead-lettered,
    never applied. Prints the acknowledgement."""
    _acknowledge(ctx, Connection(store, app, shards), entity_type, key, as_json,
                 lambda ref: ref.terminate(reason, message_id=message_id, sender=sender))


def resume_entity(
    ctx: typer.Context,
    store: StoreOption,
    app: AppOption,
    entity_type: TypeArgument,
    key: KeyArgument,
    message_id: _MessageId = None,
    sender: SenderOption = None,
    as_json: JsonFlag = False,
    shards: ShardsOption = None,
) -> None:
    """Retry a suspended run now (after deploying a fix) rather than at its next attempt.
    Prints the acknowledgement. A run that is not suspended is left alone, with nothing
    written: the command says so and exits 0 (--json: {"status": "not_suspended",
    "run_id": N}); an entity with no running run is an error (exit 1)."""
    async def work(rt: corral.Runtime) -> tuple[corral.Ack | None, corral.EntityDescription]:
        ref = rt.ref(entity_class(rt, entity_type), key)
        now = await ref.describe()
        if now.status is corral.RunStatus.RUNNING and now.suspension is None:
            return None, now  # the mark would change nothing: it is not journaled
        return await ref.resume(message_id=message_id, sender=sender), now

    ack, now = Connection(store, app, shards).call(ctx, work)
    if ack is not None:
        print_result(as_json, ack, ack_line(ack))
    else:
        print_result(as_json, {"status": "not_suspended", "run_id": now.run_id},
                     printable(f"not suspended: {now.entity_type} {now.key!r} run "
                               f"{now.run_id} is running; nothing to resume, nothing written"))


def result_of(
    ctx: typer.Context,
    store: StoreOption,
    app: AppOption,
    entity_type: TypeArgument,
    key: KeyArgument,
    wait: Annotated[float | None, typer.Option(
        "--wait", metavar="SECONDS", min=0,
        help="If the run is still running, wait this long for it to close.",
        show_default=False)] = None,
    sender: SenderOption = None,
    as_json: JsonFlag = False,
    shards: ShardsOption = None,
) -> None:
    """Print the latest run's result (what run() returned) as JSON. A failed or
    terminated run is an error (exit 1) saying why; so is a running one, unless --wait
    gives it time to close."""
    async def work(rt: corral.Runtime) -> Any:
        ref: Any = rt.ref(entity_class(rt, entity_type), key)
        if wait is None:
            now = await ref.describe(sender=sender)
            if now.status is corral.RunStatus.RUNNING:
                raise WaitTimeoutError(
                    f"{ref!r}: run {now.run_id} is still running (--wait SECONDS waits for "
                    "it to close)", entity_type=now.entity_type, key=now.key,
                    run_id=now.run_id)
        return await ref.result(timeout=wait, sender=sender)

    _print_value(as_json, Connection(store, app, shards).call(ctx, work))
