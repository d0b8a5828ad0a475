"""The `corral` command, on typer and rich.

    corral demo [--store PATH] [--ray]     the ticket-agent demo on a local SQLite store
    corral ls [TYPE]                       entities, a page at a time
    corral show TYPE KEY                   one entity: status, runs, snapshot, waits, ...
    corral waits [TYPE]                    open durable signal waits
    corral dead-letters [TYPE] [--key K]   dead letters
    corral dead-letters replay|discard ID... | --all [--type T] [--key K]
    corral signal TYPE KEY HANDLER --json PAYLOAD --message-id ID [--start JSON]
    corral deliver TYPE KEY WAIT --json PAYLOAD --key DELIVERY_KEY [--run-id N]
    corral ui [--host H] [--port P] [--token T]    the web dashboard (`corral.dashboard`)
    corral --version

Every command but `demo` takes `--store` and `--app` (`CORRAL_STORE`, `CORRAL_APP`) and
opens the runtime as a pure client (`host=False`); reads print tables, or JSON with
`--json`; writes print one line, or JSON with `--output json`. An error is one line on
stderr (`error: ErrorType: message`; `corral --debug ...` for the traceback) and exit
status 1, or 2 for bad input (`_errors`). Ray is imported only by `demo --ray`.

Modules: `_connection` (the shared options and the client runtime), `_entities`
(ls, show, signal), `_waits` (waits, deliver), `_dead_letters`, `_output` (tables,
JSON), `_errors` (one-line errors, exit statuses), `_main` (the root, demo, ui).
"""

from ._main import main

__all__ = ["main"]
