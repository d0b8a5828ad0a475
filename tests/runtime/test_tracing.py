"""OpenTelemetry traces (`corral._tracing`): one trace from an HTTP request through the
acceptance, the handler, each step attempt and a send to the second entity's handler,
linked in order (the SDK's in-memory exporter), on both stores; the context is stored
with the message, so a host SIGKILLed between acceptance and application leaves the
apply to the next host, which continues the caller's trace. A traceparent that is not
one is never stored."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import corral
from corral._common import IdReusePolicy
from corral._errors import InvalidArgumentError
from corral.persistence import Acceptance, AcceptResult, EntryKind, JournalEntry, open_store
from procs import TESTS, Worker, spawner, wait_until
from stores import sql
from trace_entities import (
    Brittle,
    Case,
    CaseInput,
    Note,
    Notifier,
    NotifierInput,
    Poison,
    Reply,
    Traced,
)
from trace_spans import dropping, named, parent_of, recording, span_id, trace_id

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # the HTTP client's


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with recording() as exporter:
        yield exporter


def _traceparent(span: ReadableSpan) -> str:
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def _app(rt: corral.Runtime, log: str) -> Starlette:
    """An ingress: the request's span continues the caller's `traceparent` header (as
    OpenTelemetry's ASGI middleware does), and the signal-with-start is made in it."""
    tracer = trace.get_tracer("ingress")

    async def post(request: Request) -> JSONResponse:
        with tracer.start_as_current_span("POST /cases/{id}/replies",
                                          context=propagate.extract(request.headers),
                                          kind=trace.SpanKind.SERVER):
            body = await request.json()
            ack = await rt.ref(Case, request.path_params["id"]).signal_with_start(
                Case.reply, Reply(text=body["text"]), start=CaseInput(log=log))
            return JSONResponse({"seq": ack.seq, "status": ack.status})

    return Starlette(routes=[Route("/cases/{id}/replies", post, methods=["POST"])])


async def _post(rt: corral.Runtime, log: str, case: str, traceparent: str) -> None:
    transport = httpx.ASGITransport(app=_app(rt, log))
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
        answer = await client.post(f"/cases/{case}/replies", json={"text": "it broke"},
                                   headers={"traceparent": traceparent})
    assert answer.status_code == 200, answer.text


async def test_a_webhook_s_trace_links_accept_apply_step_attempts_send_and_the_receiver(
        db_path: str, tmp_path: Path, spans: InMemorySpanExporter) -> None:
    log = str(tmp_path / "calls.log")
    async with corral.open_runtime(db_path, entities=[Case, Notifier]) as rt:
        await _post(rt, log, "c-1", CALLER)
        notes = rt.ref(Notifier, "notes-c-1")

        async def noted() -> bool:
            try:
                return bool(await notes.query(Notifier.seen))
            except corral.CorralError:
                return False
        await wait_until(noted, "the note reaches the second entity", timeout=60)
        await wait_until(lambda: bool(named(spans.get_finished_spans(),
                                            "corral apply Notifier")), "its apply span")
    got = spans.get_finished_spans()
    [request] = named(got, "POST")
    [accept] = named(got, "corral accept Case.reply")
    [apply] = named(got, "corral apply Case.reply")
    attempts = named(got, "corral step model:0")
    [send] = named(got, "corral send Notifier.note")
    [received] = named(got, "corral apply Notifier.note")
    # One trace, the caller's; each span the child of the one before it.
    assert {trace_id(s) for s in got} == {int(CALLER.split("-")[1], 16)}
    assert parent_of(request) == int(CALLER.split("-")[2], 16)
    assert parent_of(accept) == span_id(request)
    assert parent_of(apply) == span_id(accept)
    assert [parent_of(a) for a in attempts] == [span_id(apply)] * 3
    assert [a.attributes["corral.step.attempt"] for a in attempts] == [1, 2, 3]  # type: ignore[index]
    assert [a.status.is_ok for a in attempts] == [False, False, True]
    assert parent_of(send) == span_id(apply)
    assert parent_of(received) == span_id(send)
    # ... in the order they happened.
    chain = [request, accept, apply, *attempts, send, received]
    starts = [s.start_time or 0 for s in chain]
    assert starts == sorted(starts)
    assert apply.attributes is not None
    assert dict(apply.attributes) | {
        "corral.run_id": 1, "corral.seq": 1, "corral.attempts": 1,
        "corral.outcome": "applied", "corral.entity_type": "Case", "corral.key": "c-1",
    } == dict(apply.attributes)


async def test_a_malformed_traceparent_from_the_caller_is_never_stored(
        db_path: str, tmp_path: Path, spans: InMemorySpanExporter) -> None:
    log = str(tmp_path / "calls.log")
    hostile = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\nX-Evil: 1' OR 1=1"
    # A pure client: no host applies the entry (and a snapshot after it trims the journal).
    async with corral.open_runtime(db_path, entities=[Case, Notifier], host=False) as rt:
        await _post(rt, log, "c-2", hostile)
    [accept] = named(spans.get_finished_spans(), "corral accept Case.reply")
    # The propagator refused the header: the request started a trace of its own.
    assert trace_id(accept) != int(CALLER.split("-")[1], 16)
    assert sql(db_path, "SELECT trace FROM journal WHERE etype = 'Case'") == [
        (_traceparent(accept),)]


@pytest.mark.parametrize("bad", [
    "not a traceparent", "00-" + "0" * 32 + "-b7ad6b7169203331-01",
    CALLER.upper(), CALLER + " ", "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    CALLER + "\n"])
async def test_an_acceptance_carrying_a_bad_traceparent_is_refused_and_nothing_stored(
        db_path: str, bad: str) -> None:
    """What a Ray caller's acceptance carries is checked by the store, where it lands."""
    payload = '{"text":"x"}'
    acc = Acceptance("Case", "c-3", 0, EntryKind.SIGNAL, "reply", "m-1", payload,
                     hashlib.sha256(payload.encode()).digest(), None, '{"log":"x"}',
                     IdReusePolicy.ALLOW_DUPLICATE, 1.0, trace=bad)
    store = await open_store(db_path, shards=4)
    try:
        with pytest.raises(InvalidArgumentError, match="traceparent"):
            await store.accept(acc)
    finally:
        await store.close()
    assert sql(db_path, "SELECT count(*) FROM journal") == [(0,)]
    assert sql(db_path, "SELECT count(*) FROM entities") == [(0,)]


# -- a host SIGKILLed between acceptance and application ------------------------------------

pytestmark_kill = pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with spawner(tmp_path, TESTS / "trace_worker.py") as start:
        yield start


@pytestmark_kill
async def test_the_host_that_applies_after_a_sigkill_continues_the_caller_s_trace(
        db_path: str, tmp_path: Path, spawn: Callable[..., Worker],
        spans: InMemorySpanExporter) -> None:
    log = str(tmp_path / "calls.log")
    Path(log + ".hold").touch()  # noqa: ASYNC240 (the first host's handler holds on it)
    worker = spawn("host-1", "host", db_path)
    async with corral.open_runtime(db_path, entities=[Case, Notifier], host=False) as rt:
        with trace.get_tracer("caller").start_as_current_span("caller") as caller:
            await rt.ref(Case, "c-4").signal_with_start(Case.reply, Reply(text="hi"),
                                                        start=CaseInput(log=log))
    await wait_until(lambda: Path(log + ".held").exists(), "the handler holds",
                     alive=[worker], timeout=60)
    worker.sigkill()  # accepted, never applied: nothing of it but the journal entry
    Path(log + ".hold").unlink()  # noqa: ASYNC240
    [accept] = named(spans.get_finished_spans(), "corral accept Case.reply")
    # The context is stored with the message: the journal entry's is the accept span's.
    assert sql(db_path, "SELECT trace FROM journal WHERE etype = 'Case'") == [
        (_traceparent(accept),)]
    async with corral.open_runtime(db_path, entities=[Case, Notifier], lease_ttl=2.0) as rt:
        notes = rt.ref(Notifier, "notes-c-4")

        async def noted() -> bool:
            try:
                return bool(await notes.query(Notifier.seen))
            except corral.CorralError:
                return False
        await wait_until(noted, "the new host applies the reply and sends", timeout=60)
    got = spans.get_finished_spans()
    [apply] = named(got, "corral apply Case.reply")  # in this process: the new host
    assert parent_of(accept) == caller.get_span_context().span_id
    assert parent_of(apply) == span_id(accept)
    assert trace_id(apply) == caller.get_span_context().trace_id
    [send] = named(got, "corral send Notifier.note")
    assert parent_of(send) == span_id(apply)


_UNTRACED = """
import asyncio, sys
sys.modules["opentelemetry"] = None  # as if it were not installed: importing it fails
import corral
from corral import _tracing
from trace_entities import Case, CaseInput, Reply

async def main() -> None:
    async with corral.open_runtime(sys.argv[1], entities=[Case], host=False) as rt:
        await rt.ref(Case, "c-5").signal_with_start(Case.reply, Reply(text="x"),
                                                    start=CaseInput(log="x"))
    assert _tracing.tracer() is None
    assert "opentelemetry.trace" not in sys.modules

asyncio.run(main())
"""


def test_without_opentelemetry_a_signal_is_accepted_untraced(tmp_path: Path) -> None:
    db = str(tmp_path / "corral.db")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(TESTS.parent.parent / "src"), str(TESTS)])}
    subprocess.run([sys.executable, "-c", _UNTRACED, db], env=env, check=True, timeout=60)
    assert sql(db, "SELECT trace FROM journal") == [(None,)]


async def test_the_apply_span_says_the_message_was_dead_lettered_and_the_run_suspended(
        db_path: str, spans: InMemorySpanExporter) -> None:
    async with corral.open_runtime(db_path, entities=[Brittle]) as rt:
        ref = rt.ref(Brittle, "b-1")
        await ref.signal_with_start(Brittle.poison, Poison(), start=None)
        await ref.signal(Brittle.crash)
        await wait_until(lambda: bool(named(spans.get_finished_spans(), "corral suspend")),
                         "the run is suspended")
    got = spans.get_finished_spans()
    [poisoned] = named(got, "corral apply Brittle.poison")
    [crash] = named(got, "corral apply Brittle.crash")
    [suspend] = named(got, "corral suspend Brittle")
    assert poisoned.attributes is not None
    assert (poisoned.attributes["corral.outcome"], poisoned.attributes["corral.attempts"]) == \
        ("dead_lettered", 2)
    assert not poisoned.status.is_ok
    assert poisoned.status.description is not None
    assert "cannot parse this reply" in poisoned.status.description
    assert crash.attributes is not None
    assert crash.attributes["corral.outcome"] == "applied"
    assert parent_of(suspend) == span_id(crash)  # what the run applied last before it
    assert suspend.status.description is not None
    assert "run() hit a bug" in suspend.status.description


async def test_a_handler_s_own_spans_nest_under_its_apply_span(
        db_path: str, spans: InMemorySpanExporter) -> None:
    async with corral.open_runtime(db_path, entities=[Traced]) as rt:
        await rt.ref(Traced, "t-1").signal_with_start(Traced.work, start=None)
        await wait_until(lambda: bool(named(spans.get_finished_spans(), "app work")),
                         "the handler ran")
    got = spans.get_finished_spans()
    [apply] = named(got, "corral apply Traced.work")
    [work] = named(got, "app work")
    assert parent_of(work) == span_id(apply)


async def test_a_refused_call_s_accept_span_ends_with_the_error(
        db_path: str, spans: InMemorySpanExporter) -> None:
    async with corral.open_runtime(db_path, entities=[Notifier]) as rt:
        with pytest.raises(corral.EntityNotRunningError):
            await rt.ref(Notifier, "n-absent").signal(Notifier.note, Note(text="hi"))
    [accept] = named(spans.get_finished_spans(), "corral accept Notifier.note")
    assert not accept.status.is_ok
    assert accept.status.description is not None
    assert accept.status.description.startswith("EntityNotRunningError")
    assert [e.name for e in accept.events] == ["exception"]


async def test_a_trace_sampled_out_records_nothing_and_its_context_still_goes_on(
        db_path: str, tmp_path: Path, spans: InMemorySpanExporter) -> None:
    """A sampler that drops a trace's first span drops the rest (each a child of a span
    that is not sampled), and the context they pass on stays the caller's trace."""
    with dropping():
        async with corral.open_runtime(db_path, entities=[Case, Notifier], host=False) as rt:
            await rt.ref(Case, "c-8").signal_with_start(
                Case.reply, Reply(text="hi"), start=CaseInput(log=str(tmp_path / "l"),
                                                              fails=0))
        [(accepted,)] = sql(db_path, "SELECT trace FROM journal WHERE etype = 'Case'")
        async with corral.open_runtime(db_path, entities=[Case, Notifier]):
            async def sent() -> bool:
                return bool(sql(db_path, "SELECT 1 FROM outbox WHERE delivered"))
            await wait_until(sent, "the send is delivered", timeout=60)
    assert spans.get_finished_spans() == ()
    [(sent_trace,)] = sql(db_path, "SELECT trace FROM outbox")
    assert not int(accepted[-2:], 16) & 1  # the W3C `sampled` flag
    assert not int(sent_trace[-2:], 16) & 1
    assert accepted.split("-")[1] == sent_trace.split("-")[1]  # one trace


async def test_an_update_and_a_batch_are_accepted_in_spans_their_applies_continue(
        db_path: str, spans: InMemorySpanExporter) -> None:
    async with corral.open_runtime(db_path, entities=[Notifier]) as rt:
        refs = [rt.ref(Notifier, f"n-{n}") for n in range(3)]
        await rt.signal_many([corral.SignalItem(ref, Notifier.note, Note(text="hi"),
                                                start=NotifierInput()) for ref in refs])
        assert await refs[0].update(Notifier.count) == 1
    got = spans.get_finished_spans()
    [batch] = named(got, "corral accept batch")
    [update] = named(got, "corral accept Notifier.count")
    notes = named(got, "corral apply Notifier.note")
    [counted] = named(got, "corral apply Notifier.count")
    assert batch.attributes is not None
    assert batch.attributes["corral.batch.size"] == 3
    assert sorted(parent_of(s) for s in notes) == [span_id(batch)] * 3
    assert parent_of(counted) == span_id(update)
    assert trace_id(counted) == trace_id(update) != trace_id(batch)


@pytestmark_kill
async def test_a_host_that_does_not_trace_passes_the_caller_s_context_on_with_its_sends(
        db_path: str, tmp_path: Path, spawn: Callable[..., Worker],
        spans: InMemorySpanExporter) -> None:
    """The worker has no tracer provider: it makes no span, and its send still carries
    the caller's context to the entity it notifies."""
    worker = spawn("host-1", "host", db_path)
    async with corral.open_runtime(db_path, entities=[Case, Notifier], host=False) as rt:
        await rt.ref(Case, "c-6").signal_with_start(Case.reply, Reply(text="hi"),
                                                    start=CaseInput(log=str(tmp_path / "l")))

        async def sent() -> bool:
            return bool(sql(db_path, "SELECT 1 FROM outbox WHERE delivered"))
        await wait_until(sent, "the worker delivers the send", alive=[worker], timeout=60)
    [accept] = named(spans.get_finished_spans(), "corral accept Case.reply")
    assert sql(db_path, "SELECT trace FROM outbox") == [(_traceparent(accept),)]
    worker.stop()


def test_the_wire_forms_carry_the_trace_and_read_those_of_a_release_before_traces() -> None:
    """Ray callers and hosts of two releases meet during a rolling deploy: each reads
    what the other sends (an older one never sends a trace, and ignores one)."""
    payload = '{"text":"x"}'
    acc = Acceptance("Case", "c-7", 0, EntryKind.SIGNAL, "reply", "m-1", payload,
                     hashlib.sha256(payload.encode()).digest(), None, None,
                     IdReusePolicy.ALLOW_DUPLICATE, 1.0, trace=CALLER)
    assert Acceptance.from_wire(acc.to_wire()) == acc
    assert Acceptance.from_wire(acc.to_wire()[:16]) == acc._replace(trace=None)
    entry = JournalEntry("Case", "c-7", 3, 1, EntryKind.SIGNAL, "reply", "m-1", payload,
                         None, 1.0, CALLER)
    result = AcceptResult(duplicate=False, started=True, entry=entry, dead_letter_id=None)
    assert AcceptResult.from_wire(result.to_wire()) == result
    before = result.to_wire()[:13]  # what a release before traces sends and reads
    assert before[12] is None  # its dead_letter_id, where it reads it
    assert AcceptResult.from_wire(before) == result._replace(
        entry=entry._replace(trace=None))
