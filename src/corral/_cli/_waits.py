"""`corral waits` and `corral deliver`: open durable signal waits, and closing one.

Named after its verb group, as every `_cli` module is. The declaration of a wait is
`corral.actors._waits`, the store's decisions on one `corral.persistence._waits`.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

import corral
from corral._errors import UnknownHandlerError
from corral.actors import EntityDefinition, SignalWait

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
from ._output import cells, out, print_json, print_result, table, when

__all__ = ["deliver", "delivery_line", "list_waits", "signal_wait"]


def list_waits(
    ctx: typer.Context,
    store: StoreOption,
    app: AppOption,
    entity_type: Annotated[str | None, typer.Argument(
        metavar="TYPE", help="Only waits of this type.", show_default=False)] = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many.")] = 100,
    after: Annotated[str | None, typer.Option(
        "--after", metavar="CURSOR", help="The next page: the cursor the last page printed.")
        ] = None,
    sender: SenderOption = None,
    as_json: JsonFlag = False,
    shards: ShardsOption = None,
) -> None:
    """List open durable signal waits, oldest first (never their payloads)."""
    page = Connection(store, app, shards).call(
        ctx, lambda rt: rt.signal_waits(entity_type, limit=limit, after=after, sender=sender))
    if as_json:
        print_json(page)
        return
    console = out()
    if not page.items:
        console.print("no open waits")
    else:
        rows = table("TYPE", "KEY", "RUN", "WAIT", "WAITING SINCE", "DEADLINE")
        for w in page.items:
            rows.add_row(*cells([w.entity_type, w.key, w.run_id, w.name,
                                 when(w.waiting_since), when(w.deadline)]))
        console.print(rows)
    if page.next_cursor is not None:
        console.print(f"more: --after {page.next_cursor}")


def deliver(
    ctx: typer.Context,
    store: StoreOption,
    app: AppOption,
    entity_type: TypeArgument,
    key: KeyArgument,
    name: Annotated[str, typer.Argument(
        metavar="WAIT", help="The wait's name, as the class declares it.", show_default=False)],
    payload: Annotated[str, typer.Option(
        "--payload", "-p", metavar="JSON|@FILE|-",
        help="The payload, a JSON object of the wait's model: inline, @FILE to read a file, "
             "or - to read stdin.", show_default=False)],
    delivery_key: Annotated[str, typer.Option(
        "--key", metavar="DELIVERY_KEY",
        help="The delivery's idempotency key: the same command again is answered duplicate.",
        show_default=False)],
    sender: SenderOption = None,
    run_id: Annotated[int | None, typer.Option(
        "--run-id", metavar="RUN", min=1,
        help="Only this run (a delivery meant for a run that moved on is then stale).")
        ] = None,
    as_json: JsonFlag = False,
    shards: ShardsOption = None,
) -> None:
    """Close a durable signal wait of an entity's run, once.

    Prints the outcome: delivered, duplicate, already_delivered (another delivery won:
    its sender is shown), stale (the wait timed out or its run ended), buffered (run()
    has not reached the wait; this delivery wins when it does) or not_waiting. Each is
    an answer, not an error: the exit status is 0.
    """
    connection = Connection(store, app, shards)
    with guard(ctx):  # bad JSON never reaches the store
        data = connection.payload(payload)

    async def send(rt: corral.Runtime) -> corral.Delivery[Any]:
        ref = rt.ref(entity_class(rt, entity_type), key)
        wait = signal_wait(ref.definition, name)
        return await ref.deliver(wait, data, key=delivery_key, sender=sender, run_id=run_id)

    outcome = connection.call(ctx, send)
    print_result(as_json, outcome, delivery_line(outcome))


def signal_wait(definition: EntityDefinition, name: str) -> Any:
    """The wait `name` of the type: the class attribute, or the wait declared under that
    name (`corral.wait(Model, name=...)`), or had under it (`renamed_from=`).

    Raises:
        UnknownHandlerError: the type declares no wait of that name.
    """
    found = getattr(definition.cls, name, None)
    if isinstance(found, SignalWait):
        return found
    declared = definition.wait(name)
    name = name if declared is None else declared.name
    for attr in dir(definition.cls):
        value = getattr(definition.cls, attr, None)
        if isinstance(value, SignalWait) and value.name == name:
            return value
    raise UnknownHandlerError(
        f"{definition.name} has no wait {name!r} (its waits: {sorted(definition.waits)})",
        entity_type=definition.name)


def delivery_line(d: corral.Delivery[Any]) -> str:
    """'delivered to run 1', 'already_delivered to run 1 (won by 'ana' at ...)'."""
    line = d.status if d.run_id is None else f"{d.status} to run {d.run_id}"
    if d.status == "already_delivered":
        line += f" (won by {d.sender!r} at {when(d.delivered_at)})"
    return line
