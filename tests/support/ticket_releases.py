"""Releases of one application, `ticketdesk`, and a stream of notes to it: shared by
`tests/ray/test_ray_releases.py` (the session's Ray, SQLite) and the cluster driver
`ray_releases_cluster.py` (a multi-node cluster, PostgreSQL).

Every release is the same package, `ticketdesk` (`releases/<name>/ticketdesk`, app
`ticketdesk.agent:app`), so only the `working_dir` or `py_modules` that Ray ships
decides which code a host runs. Nothing puts a release on `sys.path`: a client process
imports one with `load_release` (a sender subprocess, `ticket_sender.py`, by `sys.path`
as a real client does), a Ray task through its own `working_dir`.

A sender (`send_notes`) sends what its release has: release 1 `comment`, release 2
`reply` and `label` (recorded `label:<id>`). A retryable error is retried with the same
message id; `HandlerNotHostedError` (the current release lacks the handler) gives the
message up: it was refused, nothing stored. Exactly-once is checked on each ticket's
own record (`History.notes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import corral
from ray_workers import CORRAL_DIR, RUNTIME_ENV

RELEASES = Path(__file__).resolve().parent / "releases"
APP = "ticketdesk.agent:app"
PACKAGE = "ticketdesk"
HOST_ENV = {"PYTHONPATH": CORRAL_DIR, "RAY_AUTH_MODE": "disabled"}
"""What a release's processes need besides the release: the corral under test (an
application would have it installed). Not `tests/support`: nothing of the tests."""

GIVE_UP_S = 120.0
"""A message still refused by a retryable error after this long is a failure."""


def release_dir(name: str) -> str:
    """The directory of release `name` (its `working_dir`: it holds `ticketdesk/`)."""
    path = RELEASES / name
    assert (path / PACKAGE / "agent.py").is_file(), f"no release {name!r} under {RELEASES}"
    return str(path)


def working_dir(name: str) -> dict[str, Any]:
    """The `runtime_env` shipping release `name` as a `working_dir`."""
    return {"working_dir": release_dir(name), "env_vars": dict(HOST_ENV)}


def py_modules(name: str) -> dict[str, Any]:
    """The `runtime_env` shipping release `name`'s package by `py_modules`."""
    return {"py_modules": [str(Path(release_dir(name)) / PACKAGE)],
            "env_vars": dict(HOST_ENV)}


def sender_env(name: str) -> dict[str, Any]:
    """The `runtime_env` of a Ray task of release `name` (`task_sender`): its
    `working_dir`, and `tests/support` for the sender's own code (never `ticketdesk`)."""
    return {"working_dir": release_dir(name), "env_vars": dict(RUNTIME_ENV["env_vars"])}


def shipped(runtime_env: dict[str, Any]) -> dict[str, Any]:
    """`runtime_env` with its local `working_dir` / `py_modules` uploaded to this Ray
    instance, as `ray.init` does for a job (a task or an actor takes URIs only): what a
    Ray task of a release is started with. Needs Ray initialized here."""
    import ray
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    scratch = ray._private.worker.global_worker.node.get_runtime_env_dir_path()
    env = upload_py_modules_if_needed(dict(runtime_env), include_gitignore=True,
                                      scratch_dir=scratch)
    return dict(upload_working_dir_if_needed(env, include_gitignore=True, scratch_dir=scratch))


@contextlib.contextmanager
def _only(path: str) -> Iterator[None]:
    """`ticketdesk` importable from `path` alone, meanwhile; forgotten afterwards."""
    def forget() -> None:
        for name in [n for n in sys.modules if n == PACKAGE or n.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]
    forget()
    sys.path.insert(0, path)
    try:
        yield
    finally:
        sys.path.remove(path)
        forget()


_LOADED: dict[str, ModuleType] = {}


def load_release(name: str) -> ModuleType:
    """Release `name`'s `ticketdesk.agent`, imported into this process for its client
    classes (once), and left importable by no one: the next `import ticketdesk` fails."""
    if name not in _LOADED:
        with _only(release_dir(name)):
            _LOADED[name] = importlib.import_module(f"{PACKAGE}.agent")
    return _LOADED[name]


def handlers_of(agent: ModuleType) -> list[tuple[Any, str]]:
    """The signals a client of this release sends, each with the mark its notes get."""
    ticket = agent.Ticket
    if hasattr(ticket, "label"):
        return [(ticket.reply, ""), (ticket.label, "label:")]
    return [(ticket.comment, "")]


@dataclass
class SendLog:
    """What one sender saw. Acked: (key, note as recorded); refused: the same, for
    messages the current release lacked a handler of (never stored)."""

    acked: list[tuple[str, str]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    uncertain: list[tuple[str, str]] = field(default_factory=list)
    """Refused as not hosted after a retry of an ambiguous error: may be stored."""
    retries: Counter[str] = field(default_factory=Counter)
    """Retryable errors seen, by type (`HandlerNotHostedError` included)."""
    errors: list[str] = field(default_factory=list)
    """Anything else (none expected)."""

    def as_json(self) -> dict[str, Any]:
        return {"acked": self.acked, "refused": self.refused, "uncertain": self.uncertain,
                "retries": dict(self.retries), "errors": self.errors}

    def add(self, other: dict[str, Any]) -> None:
        """Merge a sender's `as_json()` into this log."""
        self.acked += [(k, m) for k, m in other["acked"]]
        self.refused += [(k, m) for k, m in other["refused"]]
        self.uncertain += [(k, m) for k, m in other["uncertain"]]
        self.retries.update(other["retries"])
        self.errors += other["errors"]


async def start_tickets(rt: corral.Runtime, agent: ModuleType, keys: list[str],
                        log: SendLog) -> None:
    """Open every ticket with a first note (acknowledged in `log`)."""
    (handler, mark), *_ = handlers_of(agent)
    for key in keys:
        await rt.ref(agent.Ticket, key).signal_with_start(
            handler, agent.Note(id=f"{key}-first"), start=agent.Opened(customer=key),
            message_id=f"{key}-first")
        log.acked.append((key, f"{mark}{key}-first"))


async def send_notes(rt: corral.Runtime, agent: ModuleType, keys: list[str], who: str,
                     done: Callable[[], bool], *, least: int = 20,
                     log: SendLog | None = None) -> SendLog:
    """Send notes round-robin to the open tickets `keys` until `done()` (and `least`
    sent), each with its own message id `<who>-<n>`."""
    log = log or SendLog()
    kinds = handlers_of(agent)
    n = 0
    while n < least or not done():
        key, mid = keys[n % len(keys)], f"{who}-{n}"
        handler, mark = kinds[n % len(kinds)]
        n += 1
        await _send_one(rt.ref(agent.Ticket, key), handler, agent.Note(id=mid), mid,
                        (key, f"{mark}{mid}"), log)
    return log


async def _send_one(ref: Any, handler: Any, note: Any, mid: str, record: tuple[str, str],
                    log: SendLog) -> None:
    deadline, attempt = time.monotonic() + GIVE_UP_S, 0
    while True:
        attempt += 1
        try:
            await ref.signal(handler, note, message_id=mid)
        except corral.HandlerNotHostedError:
            log.retries["HandlerNotHostedError"] += 1
            (log.refused if attempt == 1 else log.uncertain).append(record)
            await asyncio.sleep(0.01)
            return
        except corral.CorralError as err:
            if not getattr(err, "retryable", False) or time.monotonic() > deadline:
                log.errors.append(f"{mid}: {type(err).__name__}: {err}")
                return
            log.retries[type(err).__name__] += 1
            await asyncio.sleep(0.05)
            continue
        except Exception as err:
            log.errors.append(f"{mid}: {type(err).__name__}: {err}")
            return
        log.acked.append(record)
        return


async def applied_notes(rt: corral.Runtime, agent: ModuleType, keys: list[str]
                        ) -> dict[str, list[str]]:
    """Each ticket's record of the notes it applied, once everything accepted is."""
    found = {}
    for key in keys:
        ref = rt.ref(agent.Ticket, key)
        deadline = time.monotonic() + 60
        while (d := await ref.describe()).applied_seq != d.accepted_seq:
            assert time.monotonic() < deadline, \
                f"{key}: not all applied ({d.applied_seq} of {d.accepted_seq}): {d.suspension}"
            await asyncio.sleep(0.05)
        found[key] = (await ref.query(agent.Ticket.history)).notes
    return found


def assert_applied_exactly_once(applied: dict[str, list[str]], log: SendLog) -> None:
    """Every acknowledged note applied once, none twice, no refused one applied."""
    for key, notes in applied.items():
        twice = sorted({n for n in notes if notes.count(n) > 1})
        assert not twice, f"{key}: applied twice: {twice[:5]}"
        missing = sorted(m for k, m in log.acked if k == key and m not in notes)
        assert not missing, f"{key}: acknowledged but never applied: {missing[:5]}"
        stored = sorted(m for k, m in log.refused if k == key and m in notes)
        assert not stored, f"{key}: refused (HandlerNotHostedError) but applied: {stored[:5]}"


def task_sender(store: str, namespace: str, shards: int, keys: list[str], who: str,
                stop: str) -> dict[str, Any]:
    """A Ray task of whichever release its `working_dir` ships: sends notes until the
    file `stop` exists; its `SendLog.as_json()`."""
    import ticketdesk.agent as agent  # from the task's working_dir, nowhere else

    async def send() -> dict[str, Any]:
        async with corral.open_runtime(store, entities=[agent.Ticket], backend="ray",
                                       namespace=namespace, shards=shards) as rt:
            log = await send_notes(rt, agent, keys, who, Path(stop).exists)
        return log.as_json()
    return asyncio.run(send())


def live_actors(namespace: str) -> dict[str, tuple[str, int]]:
    """The live actors of deployment `namespace` (placer and hosts), by name: (node id,
    pid). From the GCS's actor table (the state API needs a dashboard)."""
    from ray._private.state import actors

    prefix = f"corral/{namespace}/"
    return {a["Name"]: (a["Address"]["NodeID"], a["Pid"])
            for a in actors(actor_state_name="ALIVE").values()
            if a["Name"].startswith(prefix)}


def importable_here() -> str | None:
    """Where `import ticketdesk` would come from in this process (None: nowhere). A
    Ray task of the tests asks this of the session's workers."""
    spec = importlib.util.find_spec(PACKAGE)
    return None if spec is None else str(spec.origin)


__all__ = ["APP", "HOST_ENV", "RELEASES", "SendLog", "applied_notes",
           "assert_applied_exactly_once", "handlers_of", "importable_here", "live_actors",
           "load_release", "py_modules", "release_dir", "send_notes", "sender_env", "shipped",
           "start_tickets", "task_sender", "working_dir"]
