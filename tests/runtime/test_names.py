"""One name, one meaning: an internal class never takes the name of a public one, `run`
and `start` keep their domain meanings, and a record is not restated across layers
without a reason."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import itertools
import pkgutil

import corral
import corral.persistence
import corral.runtime


def public_names() -> dict[str, object]:
    """What users import by name: `corral`, `corral.runtime` and `corral.persistence`."""
    found: dict[str, object] = {}
    for package in (corral, corral.runtime, corral.persistence):
        for name in package.__all__:
            found.setdefault(name, getattr(package, name))
    return found


def test_no_class_of_corral_has_the_name_of_another_public_object() -> None:
    # The retry verdict was `DeadLetter`, the name of the stored row users read.
    public = public_names()
    clashes = []
    for info in pkgutil.walk_packages(corral.__path__, "corral."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (inspect.isclass(value) and value.__module__ == module.__name__
                    and name in public and public[name] is not value):
                clashes.append(f"{module.__name__}.{name}")
    assert clashes == []


def internal_classes() -> list[tuple[type, str, str]]:
    """(class, the name it uses, the name it no longer uses for that): `run` is the
    entity's main loop and a run of an entity, `start` a run's start (`EntityRef.start`,
    start input); hosts, queues and sessions open and close, backends handle requests,
    and a callable given to a thread or a command is called."""
    from corral._cli._connection import Connection
    from corral.persistence._batch import CommitQueue
    from corral.persistence._pg_session import HostSession, PolledSession
    from corral.persistence._sqlite_thread import SqliteThread
    from corral.runtime.client._backend import Backend
    from corral.runtime.host._host import LocalHost
    from corral.runtime.host._local_backend import LocalBackend
    from corral.runtime.host._shard import Shard
    from corral.runtime.ray._connection import RayBackend
    from corral.runtime.ray._logs import LogFollower

    return [(Backend, "handle", "run"), (LocalBackend, "handle", "run"),
            (RayBackend, "handle", "run"), (LocalHost, "open", "start"),
            (Shard, "take_up", "start"), (LogFollower, "open", "start"),
            (CommitQueue, "open", "start"), (HostSession, "open", "start"),
            (PolledSession, "open", "start"),
            (SqliteThread, "call", "run"), (Connection, "call", "run")]


def test_run_and_start_keep_their_domain_meanings_inside_the_runtime() -> None:
    for cls, used, dropped in internal_classes():
        assert hasattr(cls, used), f"{cls.__name__}.{used}"
        assert not hasattr(cls, dropped), f"{cls.__name__}.{dropped} is back"


def records(package: object) -> list[type]:
    """The dataclasses `package` exports."""
    found = [getattr(package, name) for name in package.__all__]  # type: ignore[attr-defined]
    return [r for r in found if isinstance(r, type) and dataclasses.is_dataclass(r)]


def field_names(record: type) -> set[str]:
    return {f.name for f in dataclasses.fields(record)}


IDENTITY = {"entity_type", "key", "shard"}


def test_a_public_record_built_from_a_stored_row_says_why_it_is_another_record() -> None:
    # MessageInfo and TimerInfo restated MessageRecord and TimerRecord field for field.
    silent = []
    for mine in records(corral.runtime):
        own = field_names(mine)
        for row in records(corral.persistence):
            shared = own & field_names(row)
            if (len(shared) >= 0.8 * len(own) and len(shared - IDENTITY) >= 3
                    and not issubclass(mine, row) and row.__name__ not in (mine.__doc__ or "")):
                silent.append(f"{mine.__name__} restates {row.__name__}")
    assert silent == []


def test_public_records_that_share_eight_fields_declare_them_once() -> None:
    # EntitySummary and EntityDescription each declared the same 8 fields.
    restated = []
    for one, other in itertools.combinations(records(corral.runtime), 2):
        bases = (set(one.__mro__) & set(other.__mro__)) - {object}
        declared = set().union(*(field_names(b) for b in bases if dataclasses.is_dataclass(b)))
        again = field_names(one) & field_names(other) - declared
        if len(again) >= 8:
            restated.append(f"{one.__name__} and {other.__name__}: {sorted(again)}")
    assert restated == []
