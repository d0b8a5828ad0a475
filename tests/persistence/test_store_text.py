"""Text that user code makes is stored on both engines (issue 21, item 4).

What corral writes from user code as text: an exception's message and traceback (a
dead letter, a failed run), and a run's result. Such text may hold what PostgreSQL
refuses to store (NUL, in text and as `\\u0000` in jsonb) or what neither engine can
encode (a lone surrogate: not UTF-8). A NUL is stored as its escape `\\u0000` and a
lone surrogate as U+FFFD (`persistence._codec.storable_text`), the same on both stores:
a handler quoting a payload never freezes its entity, and a run that raises or returns
such text still closes.
"""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

import corral
from procs import wait_until
from stores import sql

# A handler quoting what it was sent (NUL), and bytes decoded with surrogateescape (a
# lone surrogate): both reach the message of the exception it raises.
UNSTORABLE = "bad\x00input " + b"\xff".decode("utf-8", "surrogateescape")
STORED = "bad\\u0000input \ufffd"


class Init(BaseModel):
    owner: str


class Line(BaseModel):
    text: str


class Parser(corral.Entity):
    """Takes lines; a line starting with "bad" makes its handler raise, quoting it."""

    retry = corral.RetryPolicy(max_attempts=2, initial_backoff=0.001, max_backoff=0.001)

    def __init__(self, init: Init) -> None:
        self.lines: list[str] = []

    @corral.signal
    def line(self, line: Line) -> None:
        if line.text.startswith("bad"):
            raise ValueError(f"cannot parse {UNSTORABLE}")
        self.lines.append(line.text)

    @corral.query
    def taken(self) -> list[str]:
        return self.lines


class Job(corral.Entity):
    """`run()` fails its run with the unstorable text in its message."""

    fail_on = (ValueError,)

    def __init__(self, init: Init) -> None:
        self.owner = init.owner

    async def run(self) -> None:
        await asyncio.sleep(0)
        raise ValueError(f"job failed: {UNSTORABLE}")


class Buggy(corral.Entity):
    """`run()` has a bug whose message holds the unstorable text: the run is suspended."""

    run_retry = corral.RetryPolicy(max_attempts=None, initial_backoff=3600, max_backoff=3600)

    def __init__(self, init: Init) -> None:
        self.owner = init.owner

    async def run(self) -> None:
        await asyncio.sleep(0)
        raise ValueError(f"bug: {UNSTORABLE}")


class Echo(corral.Entity):
    """`run()` returns a str holding a NUL and a lone surrogate."""

    def __init__(self, init: Init) -> None:
        self.owner = init.owner

    async def run(self) -> str:
        return f"done: {UNSTORABLE}"


async def test_a_handler_raising_with_a_nul_and_a_lone_surrogate_is_dead_lettered_and_the_next_message_applies(  # noqa: E501
    db_path: str,
) -> None:
    async with corral.open_runtime(db_path, entities=[Parser]) as rt:
        ref = rt.ref(Parser, "p")
        start = Init(owner="ops")
        await ref.signal_with_start(Parser.line, Line(text="bad\x00line"), start=start)
        await ref.signal(Parser.line, Line(text="good"))

        async def taken() -> bool:
            return await ref.query(Parser.taken) == ["good"]
        await wait_until(taken, "the line after the dead-lettered one is applied")
        [dead] = await ref.dead_letters()
    assert dead.error == f"ValueError: cannot parse {STORED}"
    assert f"ValueError: cannot parse {STORED}" in dead.traceback
    assert dead.payload == '{"text":"bad\\u0000line"}'  # the payload, as it was accepted


async def test_a_run_raising_with_a_nul_and_a_lone_surrogate_closes_as_failed(
    db_path: str,
) -> None:
    async with corral.open_runtime(db_path, entities=[Job]) as rt:
        ref = rt.ref(Job, "j")
        await ref.start(start=Init(owner="ops"))
        with pytest.raises(corral.EntityFailedError):
            await ref.result(timeout=30)
        info = await ref.describe()
    assert info.status is corral.RunStatus.FAILED
    [(error,)] = sql(db_path, "SELECT error FROM runs WHERE etype='Job' AND key='j'")
    assert f"ValueError: job failed: {STORED}" in error


async def test_a_run_suspended_by_an_error_with_a_nul_and_a_lone_surrogate_records_it(
    db_path: str,
) -> None:
    async with corral.open_runtime(db_path, entities=[Buggy]) as rt:
        ref = rt.ref(Buggy, "b")
        await ref.start(start=Init(owner="ops"))

        async def suspended() -> bool:
            return (await ref.describe()).suspension is not None
        await wait_until(suspended, "the run is suspended")
        info = await ref.describe()
    assert info.status is corral.RunStatus.RUNNING
    assert info.suspension is not None
    assert f"ValueError: bug: {STORED}" in info.suspension.error


async def test_a_run_returning_a_nul_and_a_lone_surrogate_closes_with_its_result_stored(
    db_path: str,
) -> None:
    async with corral.open_runtime(db_path, entities=[Echo]) as rt:
        ref = rt.ref(Echo, "e")
        await ref.start(start=Init(owner="ops"))

        value = await ref.result(timeout=30)
    assert value == "done: bad\x00input \ufffd"  # the NUL was JSON's own escape
    [(result,)] = sql(db_path, "SELECT result FROM runs WHERE etype='Echo' AND key='e'")
    assert result == f'"done: {STORED}"'
