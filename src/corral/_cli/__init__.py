"""The `corral` command, on typer and rich.

    corral demo [--store PATH] [--ray]     the ticket-agent demo on a local SQLite store
    corral ls [TYPE]                       entities, a page at a time
    corral show TYPE KEY [--state]         one entity: status, runs, snapshot, waits, ...
                                           (--state: its state and the messages after it)
    corral history TYPE KEY                runs, messages, waits and timers, paged
    corral waits [TYPE]                    open durable signal waits
    corral dead-letters [TYPE] [--key K]   dead letters
    corral dead-letters replay|discard ID... | --all [--type T] [--key K]
    corral start TYPE KEY [-p START_INPUT] [--start-id ID]
    corral signal TYPE KEY HANDLER [-p PAYLOAD] --message-id ID [--start JSON]
    corral update TYPE KEY HANDLER [-p PAYLOAD] [--update-id ID] [--start JSON]
    corral query TYPE KEY HANDLER [-p PAYLOAD]
    corral deliver TYPE KEY WAIT -p PAYLOAD --key DELIVERY_KEY [--run-id N]
    corral terminate|resume TYPE KEY       close a run; retry a suspended one now
    corral result TYPE KEY [--wait S]      what the latest run returned
    corral builds | check-snapshots        the build registry; do snapshots restore?
    corral deploy --app A [--store S] [status|stop]  a release on Ray, rolled to
    corral nodes [drain|undrain NODE_ID] [--namespace NS]   a Ray deployment's nodes
    corral ui [--host H] [--port P] [--token T]    the web dashboard (`corral.dashboard`)
    corral --version

Every command but `demo` and `builds` takes `--store` and `--app` (`CORRAL_STORE`,
`CORRAL_APP`) and opens the runtime as a pure client (`host=False`). One flag grammar:
`--json` prints JSON (for scripts) instead of a table or a line, on every command; a
payload, start input or query argument is `--payload`/`-p` (inline JSON, `@file`, or `-`
for stdin; `signal`/`deliver`'s old `--json PAYLOAD` still works, with a deprecation
line). An error is one line on stderr (`error: ErrorType: message`; `corral --debug ...`
for the traceback) and exit status 1, or 2 for bad input (`_failure`). Ray is imported
only by `demo --ray` and the Ray commands (`deploy`, `nodes`, `metrics --namespace`),
which take `--namespace` and `--address` instead of `--store`.

Modules: `_connection` (the shared options and the client runtime), `_input` (payloads),
`_entities` (ls, show, signal), `_history` (history, show --state), `_verbs` (start,
update, query, terminate, resume, result), `_waits` (waits, deliver), `_dead_letters`,
`_builds`, `_snapshots`, `_deploy` (deploy, status, stop, roll), `_nodes` (nodes, drain, undrain),
`_groups` (a group whose bare name lists), `_output` (tables, JSON), `_failure`
(one-line errors, exit statuses), `_main` (the root, demo, ui).
"""

from ._main import main

__all__ = ["main"]
