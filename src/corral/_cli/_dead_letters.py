"""`corral dead-letters`: list dead letters, and replay or discard them, by id or all.

A dead letter's id is unique in the store: `replay 17` looks it up among the store's
dead letters to find its entity (or, once replayed, among the replays the dedupe windows
remember, so a repeat is answered duplicate), and `--type T --key K` names the entity outright (no
lookup). Several ids, and `--all`, are worked through oldest first and one at a time,
so an entity's replayed signals keep their original order; one that fails (its entity
is not running, say) is reported and the rest go on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

import corral
from corral._errors import (
    CorralError,
    CorruptRowError,
    DeadLetterNotFoundError,
    InvalidArgumentError,
    StoreError,
)
from corral.persistence import Row
from corral.runtime.client._boundary import check_dead_letter_id

from ._connection import (
    AppOption,
    Connection,
    JsonFlag,
    SenderOption,
    ShardsOption,
    StoreOption,
    entity_class,
)
from ._entities import ack_line
from ._failure import EXIT_FAILED, debugging, one_line, report
from ._groups import ListUnlessNamed
from ._output import cells, err_console, jsonable, out, print_json, table, when

__all__ = ["commands"]

_PAGE = 10_000  # dead letters read per call while finding ids or working through --all


commands = typer.Typer(
    cls=ListUnlessNamed, name="dead-letters", add_completion=False,
    help="List dead letters (signals whose handler kept raising), or replay or discard them. "
         "Without a subcommand: list.")

_TypeFilter = Annotated[str | None, typer.Option(
    "--type", metavar="TYPE", help="Only dead letters of this entity type.")]
_KeyFilter = Annotated[str | None, typer.Option(
    "--key", metavar="KEY", help="Only dead letters of entities with this key.")]
_Ids = Annotated[list[int] | None, typer.Argument(
    metavar="ID...", min=1, show_default=False,
    help="Dead letter ids (see `corral dead-letters`).")]
_All = Annotated[bool, typer.Option(
    "--all", help="Every dead letter (of --type and --key, if given), with a progress bar.")]


@dataclass(frozen=True)
class _Letter:
    """A dead letter as these commands address it."""

    id: int
    entity_type: str
    key: str

    def __str__(self) -> str:
        return f"dead letter {self.id} of {self.entity_type} {self.key!r}"


@commands.command("list")
def list_dead_letters(
    ctx: typer.Context,
    store: StoreOption,
    app: AppOption,
    entity_type: Annotated[str | None, typer.Argument(
        metavar="TYPE", help="Only dead letters of this type.", show_default=False)] = None,
    key: _KeyFilter = None,
    limit: Annotated[int, typer.Option("--limit", help="At most this many.")] = 100,
    after: Annotated[int | None, typer.Option(
        "--after", metavar="ID", help="Only ids above this one: the last id of the "
        "previous page.", show_default=False)] = None,
    sender: SenderOption = None,
    as_json: JsonFlag = False,
    shards: ShardsOption = None,
) -> None:
    """List dead letters, oldest first (`corral dead-letters TYPE` is the same)."""
    found = Connection(store, app, shards).call(
        ctx, lambda rt: rt.dead_letters(entity_type, key, limit=limit, after=after,
                                        sender=sender))
    if as_json:
        # The payload is stored as canonical JSON text: shown as the JSON it is.
        print_json([{**jsonable(d), **_payload(d)} for d in found])
        return
    if not found:
        out().print("no dead letters")
        return
    rows = table("ID", "TYPE", "KEY", "RUN", "SEQ", "SIGNAL", "MESSAGE ID", "SENDER",
                 "ATTEMPTS", "FAILED AT", "ERROR")
    for d in found:
        rows.add_row(*cells([d.id, d.entity_type, d.key, d.run_id, d.seq, d.name,
                             d.message_id, d.sender, d.attempts, when(d.failed_at), d.error]))
    out().print(rows)


@commands.command("replay")
def replay(
    ctx: typer.Context,
    store: StoreOption,
    app: AppOption,
    ids: _Ids = None,
    everything: _All = False,
    entity_type: _TypeFilter = None,
    key: _KeyFilter = None,
    sender: SenderOption = None,
    as_json: JsonFlag = False,
    shards: ShardsOption = None,
) -> None:
    """Deliver dead letters again as new signals to their entities' running runs, and
    delete them (one transaction each); use it after fixing the handler.

    `replay 17 18` finds each id in the store; `replay 17 --type T --key K` names its
    entity (no lookup); `replay --all --type T` replays every dead letter of T. A
    replay repeated is answered duplicate and applied once (while the entity's dedupe
    window remembers the replay).
    """
    async def one(rt: corral.Runtime, letter: _Letter) -> corral.Ack:
        ref = rt.ref(entity_class(rt, letter.entity_type), letter.key)
        return await ref.replay_dead_letter(letter.id, sender=sender)

    choice = _Choice(ids or [], everything, entity_type, key, sender, replays=True)
    _work_through(ctx, Connection(store, app, shards), choice, one, verb="replayed",
                  doing="replaying", as_json=as_json,
                  describe=lambda letter, ack: f"replayed {letter}: {ack_line(ack)}")


@commands.command("discard")
def discard(
    ctx: typer.Context,
    store: StoreOption,
    app: AppOption,
    ids: _Ids = None,
    everything: _All = False,
    entity_type: _TypeFilter = None,
    key: _KeyFilter = None,
    sender: SenderOption = None,
    as_json: JsonFlag = False,
    shards: ShardsOption = None,
) -> None:
    """Delete dead letters without delivering them.

    `discard 17 18` finds each id in the store; `discard 17 --type T --key K` names its
    entity (no lookup); `discard --all --type T` discards every dead letter of T.
    """
    async def one(rt: corral.Runtime, letter: _Letter) -> bool:
        ref = rt.ref(entity_class(rt, letter.entity_type), letter.key)
        if not await ref.discard_dead_letter(letter.id, sender=sender):
            raise DeadLetterNotFoundError(f"{letter} is not there (discarded, or replayed)",
                                          entity_type=letter.entity_type, key=letter.key)
        return True

    _work_through(ctx, Connection(store, app, shards), _Choice(ids or [], everything,
                  entity_type, key, sender), one, verb="discarded", doing="discarding",
                  as_json=as_json, describe=lambda letter, _: f"discarded {letter}")


@dataclass(frozen=True)
class _Choice:
    """Which dead letters a replay or discard is about."""

    ids: list[int]
    everything: bool
    entity_type: str | None
    key: str | None
    sender: str | None  # claimed for the reads that find the letters, as for the writes
    replays: bool = False
    """A replay: an id replayed before is found through its replay (a CLI client is
    always on the local backend, so it reads the store itself)."""

    async def letters(self, rt: corral.Runtime) -> list[_Letter]:
        """The chosen dead letters, checked before any is touched.

        Raises:
            InvalidArgumentError: neither ids nor --all, or both, or an id that no dead
                letter can have (0, or 2^63 and over): bad input, not one failed item.
            DeadLetterNotFoundError: an id that is not in the store (none is touched).
        """
        if self.everything == bool(self.ids):
            raise InvalidArgumentError(
                "name the dead letters: their ids, or --all (narrowed by --type and --key)")
        for i in self.ids:
            check_dead_letter_id(i)
        etype, key = self.entity_type, self.key
        if self.ids and etype is not None and key is not None:
            rt.ref(entity_class(rt, etype), key)  # checks both before anything is sent
            return [_Letter(i, etype, key) for i in self.ids]
        wanted = set(self.ids)
        by_id: dict[int, _Letter] = {}
        after = 0
        while page := await rt.dead_letters(etype, key, limit=_PAGE, after=after,
                                            sender=self.sender):
            by_id.update((d.id, _Letter(d.id, d.entity_type, d.key)) for d in page
                         if self.everything or d.id in wanted)
            if not self.everything and wanted <= by_id.keys():
                break
            after = page[-1].id
        if self.everything:
            return list(by_id.values())
        if self.replays:  # replayed before: its entity answers the repeat "duplicate"
            for i in (i for i in self.ids if i not in by_id):
                found = await rt.store.replayed_to(i)
                if found is not None and etype in (None, found[0]) and key in (None, found[1]):
                    by_id[i] = _Letter(i, *found)
        missing = [i for i in self.ids if i not in by_id]
        if missing:
            among = f" of {etype}" if etype else ""
            among += f" with key {key!r}" if key else ""
            raise DeadLetterNotFoundError(
                f"no dead letter {', '.join(map(str, missing))} among the store's dead "
                f"letters{among}")
        return [by_id[i] for i in self.ids]


@dataclass(frozen=True)
class _Outcome:
    """What became of one dead letter: the action's result, or its error."""

    letter: _Letter
    result: Any = None
    error: CorralError | None = None

    def as_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {"id": self.letter.id, "entity_type": self.letter.entity_type,
                                 "key": self.letter.key}
        if self.error is not None:
            found["error"] = {"type": type(self.error).__name__,
                              "message": one_line(self.error).partition(": ")[2]}
        elif isinstance(self.result, corral.Ack):
            found["ack"] = jsonable(self.result)
        else:
            found["discarded"] = True
        return found


def _work_through(ctx: typer.Context, connection: Connection, choice: _Choice,
                  one: Callable[[corral.Runtime, _Letter], Awaitable[Any]], *, verb: str,
                  doing: str, as_json: bool, describe: Callable[[_Letter, Any], str]) -> None:
    """Apply `one` to every chosen dead letter in turn and print what happened.

    A `CorralError` of one dead letter is reported and the rest go on (the exit status
    is then 1); a `StoreError` stops the command.
    """
    debug = debugging(ctx)

    async def work(rt: corral.Runtime) -> list[_Outcome]:
        from rich.progress import (  # only here: it costs every other command 40 ms
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        letters = await choice.letters(rt)
        done: list[_Outcome] = []
        console = err_console()
        with Progress(TextColumn(doing), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console,
                      disable=not (choice.everything and console.is_terminal)) as progress:
            task = progress.add_task(verb, total=len(letters))
            for letter in letters:
                try:
                    done.append(_Outcome(letter, await one(rt, letter)))
                except StoreError:
                    raise
                except CorralError as err:
                    if debug:
                        raise
                    done.append(_Outcome(letter, error=err))
                progress.advance(task)
        return done

    done = connection.call(ctx, work)
    failed = [o for o in done if o.error is not None]
    for o in failed:
        assert o.error is not None
        report(o.error)  # the runtime's messages name the dead letter and its entity
    if as_json:
        print_json([o.as_json() for o in done])
    elif choice.everything:
        succeeded = len(done) - len(failed)
        print(f"{verb} {succeeded} dead letter{'' if succeeded == 1 else 's'}"
              + (f"; {len(failed)} failed" if failed else ""))
    else:
        for o in done:
            if o.error is None:
                print(describe(o.letter, o.result))
    if failed:
        raise typer.Exit(EXIT_FAILED)


def _payload(d: corral.DeadLetter) -> dict[str, Any]:
    """A dead letter's payload as JSON data; one that does not decode (a row damaged or
    written by hand) is null, with why, so one bad row never breaks the listing."""
    row = Row("dead_letters", d.entity_type, d.key, d.run_id, what=f"dead letter {d.id}")
    try:
        return {"payload": row.json("payload", d.payload)}
    except CorruptRowError as err:
        return {"payload": None, "unreadable": str(err)}
