"""Untrusted input stops at the client boundary and leaves the store untouched (guarantee 11)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import corral
from entities import (
    ALL_ENTITIES,
    Assign,
    Blob,
    Chain,
    Inbox,
    Job,
    Other,
    Reply,
    Start,
    Ticket,
    Unregistered,
    fresh_key,
    wait_applied,
)
from stores import sql, store_rows

START = Start(tenant="acme")
LIMITS = corral.Limits(max_payload_bytes=512, max_key_length=64)

Call = Callable[[corral.Runtime, str], Awaitable[Any]]


def sws(payload: Any, *, handler: Any = Ticket.reply, start: Any = START, **kw: Any) -> Call:
    return lambda rt, key: rt.ref(Ticket, key).signal_with_start(handler, payload, start=start,
                                                                 **kw)


def on_key(bad_key: Any) -> Call:
    return lambda rt, _: rt.ref(Ticket, bad_key).signal_with_start(Ticket.reply, Reply(text="x"),
                                                                   start=START)


def nested_list(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def nested_dict(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def mutated(model: Any, **changes: Any) -> Any:
    """A model instance changed after construction (pydantic does not validate this)."""
    for field, value in changes.items():
        setattr(model, field, value)
    return model


def deep_construct(depth: int, *, valid: bool = False) -> Chain:
    """A `Chain` nested `depth` deep, built unvalidated (or, with `valid`, validated)."""
    chain = Chain(text="end") if valid else Chain.model_construct(text=7)
    for _ in range(depth):
        chain = Chain.model_construct(text="x", child=chain)
    return chain


class Ticket2(corral.Entity):
    """Same handlers as a registered type, but not registered itself."""

    name = "Ticket"

    @corral.signal
    def reply(self, reply: Reply) -> None:
        pass


BAD_INPUTS: list[tuple[str, Call, type[Exception]]] = [
    # payloads
    ("wrong model type", sws(Other(text="x")), corral.InvalidPayloadError),
    ("not a model or dict", sws("x"), corral.InvalidPayloadError),
    ("payload missing", sws(None), corral.InvalidPayloadError),
    ("missing field", sws({}), corral.InvalidPayloadError),
    ("wrong field type", sws({"text": 5}), corral.InvalidPayloadError),
    ("field is null", sws({"text": None}), corral.InvalidPayloadError),
    ("extra unknown field", sws({"text": "x", "junk": 1}), corral.InvalidPayloadError),
    ("payload over the limit", sws(Reply(text="x" * 600)), corral.PayloadTooLargeError),
    ("dict payload over the limit", sws({"text": "é" * 300}), corral.PayloadTooLargeError),
    ("object in an Any field", sws(Blob(value=object()), handler=Ticket.attach),
     corral.InvalidPayloadError),
    ("object in an Any field, as a dict", sws({"value": object()}, handler=Ticket.attach),
     corral.InvalidPayloadError),
    ("nan in an Any field", sws(Blob(value=float("nan")), handler=Ticket.attach),
     corral.InvalidPayloadError),
    ("inf in an Any field, as a dict", sws({"value": [float("inf")]}, handler=Ticket.attach),
     corral.InvalidPayloadError),
    ("nan in a float field", sws(Blob(x=float("nan")), handler=Ticket.attach),
     corral.InvalidPayloadError),
    ("inf in a float field, as a dict", sws({"x": float("-inf")}, handler=Ticket.attach),
     corral.InvalidPayloadError),
    ("invalid utf-8 bytes", sws(Blob(value=b"\xff"), handler=Ticket.attach),
     corral.InvalidPayloadError),
    ("non-string dict key", sws({"value": {1: "a"}}, handler=Ticket.attach),
     corral.InvalidPayloadError),
    # handlers
    ("handler given by name", sws(Reply(text="x"), handler="reply"),
     corral.UnknownHandlerError),
    ("unknown handler name", sws(Reply(text="x"), handler="nope"), corral.UnknownHandlerError),
    ("a look-alike's handler of the same name", sws(Reply(text="x"), handler=Ticket2.reply),
     corral.UnknownHandlerError),
    ("query used as a signal", sws(Reply(text="x"), handler=Ticket.status),
     corral.UnknownHandlerError),
    ("update used as a signal", sws(Assign(agent="a"), handler=Ticket.assign),
     corral.UnknownHandlerError),
    ("another type's signal", sws(Reply(text="x"), handler=Job.poke), corral.UnknownHandlerError),
    ("handler that is not a handler", sws(Reply(text="x"), handler=print),
     corral.UnknownHandlerError),
    ("signal used as an update", lambda rt, key: rt.ref(Ticket, key).update_with_start(
        Ticket.reply, Reply(text="x"), start=START), corral.UnknownHandlerError),
    ("signal used as a query", lambda rt, key: rt.ref(Ticket, key).query(Ticket.reply),
     corral.UnknownHandlerError),
    # entity types
    ("unregistered entity type", lambda rt, key: rt.ref(Unregistered, key).signal_with_start(
        Unregistered.reply, Reply(text="x"), start=None), corral.UnknownEntityTypeError),
    ("look-alike of a registered type", lambda rt, key: rt.ref(Ticket2, key).signal_with_start(
        Ticket2.reply, Reply(text="x"), start=None), corral.UnknownEntityTypeError),
    ("a type that is not an entity", lambda rt, key: rt.ref(Reply, key),  # type: ignore[arg-type]
     corral.UnknownEntityTypeError),
    # keys
    ("empty key", on_key(""), corral.InvalidKeyError),
    ("over-long key", on_key("k" * 65), corral.InvalidKeyError),
    ("key with NUL", on_key("a\x00b"), corral.InvalidKeyError),
    ("key with newline", on_key("a\nb"), corral.InvalidKeyError),
    ("key with DEL", on_key("a\x7fb"), corral.InvalidKeyError),
    ("key with a space", on_key("a b"), corral.InvalidKeyError),
    ("key with a leading space", on_key(" ab"), corral.InvalidKeyError),
    ("key with a tab", on_key("ab\t"), corral.InvalidKeyError),
    ("key with a trailing newline", on_key("ab\n"), corral.InvalidKeyError),
    ("key that is not a str", on_key(42), corral.InvalidKeyError),
    ("key with non-ASCII", on_key("tické"), corral.InvalidKeyError),
    # start input
    ("start input missing", sws(Reply(text="x"), start=None), corral.InvalidPayloadError),
    ("start input of the wrong model", sws(Reply(text="x"), start=Other(text="x")),
     corral.InvalidPayloadError),
    ("start input missing a field", sws(Reply(text="x"), start={}), corral.InvalidPayloadError),
    ("start input with an extra field", sws(Reply(text="x"), start={"tenant": "a", "x": 1}),
     corral.InvalidPayloadError),
    ("start input over the limit", sws(Reply(text="x"), start=Start(tenant="t" * 600)),
     corral.PayloadTooLargeError),
    ("start input not JSON", sws(Reply(text="x"), start={"tenant": object()}),
     corral.InvalidPayloadError),
    ("start input for a type without one", lambda rt, key: rt.ref(Inbox, key)
     .signal_with_start(Inbox.note, {"text": "x"}, start=START), corral.InvalidPayloadError),
    # message ids and senders
    ("empty message id", sws(Reply(text="x"), message_id=""), corral.InvalidKeyError),
    ("message id with a control character", sws(Reply(text="x"), message_id="m\x00"),
     corral.InvalidKeyError),
    ("over-long message id", sws(Reply(text="x"), message_id="m" * 65), corral.InvalidKeyError),
    ("message id that is not a str", sws(Reply(text="x"), message_id=7), corral.InvalidKeyError),
    ("sender that is not a str", sws(Reply(text="x"), sender=7), corral.InvalidKeyError),
    ("message id with a lone surrogate", sws(Reply(text="x"), message_id="m-\ud800"),
     corral.InvalidKeyError),
    ("message id with a C1 control character", sws(Reply(text="x"), message_id="m\x85"),
     corral.InvalidKeyError),
    ("sender with a lone surrogate", sws(Reply(text="x"), sender="\udfffbob"),
     corral.InvalidKeyError),
    ("sender with a control character", sws(Reply(text="x"), sender="bob\n"),
     corral.InvalidKeyError),
    ("empty sender", sws(Reply(text="x"), sender=""), corral.InvalidKeyError),
    ("update id with a lone surrogate", lambda rt, key: rt.ref(Ticket, key).update_with_start(
        Ticket.assign, Assign(agent="a"), start=START, update_id="\ud83d"),
     corral.InvalidKeyError),
    ("update timeout that is not a number", lambda rt, key: rt.ref(Ticket, key)
     .update_with_start(Ticket.assign, Assign(agent="a"), start=START, timeout="soon"),
     corral.InvalidArgumentError),
    ("terminate reason with a lone surrogate", lambda rt, key: rt.ref(Ticket, key)
     .terminate("bye \ud800"), corral.InvalidArgumentError),
    ("terminate reason that is not a str", lambda rt, key: rt.ref(Ticket, key)
     .terminate(42), corral.InvalidArgumentError),
    ("handler name with a lone surrogate", sws(Reply(text="x"), handler="re\ud800ply"),
     corral.UnknownHandlerError),
    # strings inside payloads and start inputs: valid Unicode only
    ("lone surrogate in a payload string", sws(Reply(text="a\ud800b")),
     corral.InvalidPayloadError),
    ("lone surrogate in a dict payload", sws({"text": "\udc00"}), corral.InvalidPayloadError),
    ("lone surrogate in a nested dict key", sws({"value": {"k\ud800": 1}},
                                                handler=Ticket.attach),
     corral.InvalidPayloadError),
    ("lone surrogate in the start input", sws(Reply(text="x"), start=Start(tenant="\ud800")),
     corral.InvalidPayloadError),
    ("list nested past what the host can parse back", sws({"value": nested_list(150)},
                                                          handler=Ticket.attach),
     corral.InvalidPayloadError),
    ("deeply nested list in an Any field", sws({"value": nested_list(5000)},
                                               handler=Ticket.attach),
     corral.InvalidPayloadError),
    ("deeply nested dict in an Any field", sws(Blob(value=nested_dict(5000)),
                                               handler=Ticket.attach),
     corral.InvalidPayloadError),
    # model instances are validated like dicts
    ("instance mutated to a wrong type", sws(mutated(Reply(text="x"), text=5)),
     corral.InvalidPayloadError),
    ("instance mutated to a NaN", sws(mutated(Blob(x=1.0), x=float("nan")),
                                      handler=Ticket.attach), corral.InvalidPayloadError),
    ("model_construct with a wrong type", sws(Reply.model_construct(text=5)),
     corral.InvalidPayloadError),
    ("model_construct missing a field", sws(Reply.model_construct()),
     corral.InvalidPayloadError),
    ("start input mutated to a wrong type", sws(Reply(text="x"),
                                                start=mutated(Start(tenant="a"), tenant=None)),
     corral.InvalidPayloadError),
    ("start input from model_construct", sws(Reply(text="x"), start=Start.model_construct()),
     corral.InvalidPayloadError),
    ("unvalidated instance inside a dict payload",
     sws({"text": "x", "child": Chain.model_construct(text=["not", "a", "str"])},
         handler=Ticket.link), corral.InvalidPayloadError),
    ("mutated instance two levels inside a dict", sws(
        {"text": "x", "child": {"text": "y", "child": mutated(Chain(text="z"), text=7)}},
        handler=Ticket.link), corral.InvalidPayloadError),
    ("deeply nested model_construct", sws(deep_construct(3000), handler=Ticket.link),
     corral.InvalidPayloadError),
    ("deeply nested model", sws(deep_construct(3000, valid=True), handler=Ticket.link),
     corral.InvalidPayloadError),
]


@pytest.mark.parametrize(("call", "error"), [(c, e) for _, c, e in BAD_INPUTS],
                         ids=[name for name, _, _ in BAD_INPUTS])
async def test_a_bad_input_gets_its_typed_error_and_leaves_the_store_untouched(
    db_path: str, call: Call, error: type[Exception]
) -> None:
    running = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES, limits=LIMITS) as rt:
        ref = rt.ref(Ticket, running)
        await ref.signal_with_start(Ticket.reply, Reply(text="ok"), start=START)
        await wait_applied(ref, 1)
        before = store_rows(db_path)
        for key in (running, fresh_key()):
            with pytest.raises(error) as caught:
                await call(rt, key)
            assert isinstance(caught.value, corral.CorralError)
            assert str(caught.value)
            assert store_rows(db_path) == before
        status = await ref.query(Ticket.status)
    assert status.inbox == ["acme:ok"]


async def test_the_limits_themselves_are_accepted(db_path: str) -> None:
    """The boundary is not over-eager: the largest key and payload pass."""
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES, limits=LIMITS) as rt:
        key = "k" * 64
        ref = rt.ref(Ticket, key)
        text = "x" * (512 - len('{"text":""}'))
        ack = await ref.signal_with_start(Ticket.reply, Reply(text=text), start=START,
                                          message_id="m" * 64)
        ack2 = await ref.signal(Ticket.attach, Blob(value={"a": [1, 2.5, None, "é"]}, x=1.5))
        await ref.signal(Ticket.attach, Blob(value=nested_list(90)))  # deep, within the limit
        for odd in ("a.b", "user@example.com", "tenant/ticket:9104", "A-1_2+3=4#5"):
            await rt.ref(Ticket, odd).signal_with_start(Ticket.reply, {"text": "x"}, start=START)
        with pytest.raises(corral.PayloadTooLargeError):
            await ref.signal(Ticket.reply, Reply(text=text + "x"))
    assert ack.status == ack2.status == "accepted"


async def test_a_custom_key_pattern_is_enforced(db_path: str) -> None:
    limits = corral.Limits(key_pattern=r"ticket-[0-9]+")
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES, limits=limits) as rt:
        await rt.ref(Ticket, "ticket-9104").signal_with_start(Ticket.reply, Reply(text="x"),
                                                              start=START)
        with pytest.raises(corral.InvalidKeyError, match="must match"):
            rt.ref(Ticket, "ticket-9104x")
        with pytest.raises(corral.InvalidKeyError):
            rt.ref(Ticket, "ticket-\n1")


# -- authorize ---------------------------------------------------------------------------


def reject_bob(req: corral.AuthRequest) -> str | bool | None:
    return False if req.sender == "bob" else req.sender


def raise_for_bob(req: corral.AuthRequest) -> str | None:
    if req.sender == "bob":
        raise corral.UnauthorizedError(f"bob may not send {req.name}")
    return req.sender


def as_bob(ref: corral.EntityRef[Ticket]) -> list[Awaitable[Any]]:
    """Every kind of call, claiming to be bob."""
    return [
        ref.signal_with_start(Ticket.reply, Reply(text="x"), start=START, sender="bob"),
        ref.signal(Ticket.reply, Reply(text="x"), sender="bob"),
        ref.update_with_start(Ticket.assign, Assign(agent="a"), start=START, sender="bob"),
        ref.update(Ticket.assign, Assign(agent="a"), sender="bob"),
        ref.terminate(reason="x", sender="bob"),
        ref.query(Ticket.status, sender="bob"),
    ]


@pytest.mark.parametrize("hook", [reject_bob, raise_for_bob], ids=["returns False", "raises"])
async def test_authorize_rejecting_raises_unauthorized_and_stores_nothing(
    db_path: str, hook: Callable[[corral.AuthRequest], Any]
) -> None:
    running = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES, authorize=hook) as rt:
        await rt.ref(Ticket, running).signal_with_start(Ticket.reply, Reply(text="ok"),
                                                        start=START, sender="alice")
        before = store_rows(db_path)
        for key in (running, fresh_key()):
            for attempt in as_bob(rt.ref(Ticket, key)):
                with pytest.raises(corral.UnauthorizedError):
                    await attempt
        assert store_rows(db_path) == before
        status = await rt.ref(Ticket, running).query(Ticket.status, sender="alice")
    assert status.inbox == ["acme:ok"]


async def test_a_spoofed_sender_is_replaced_by_the_authenticated_one(db_path: str) -> None:
    seen: list[corral.AuthRequest] = []

    def authenticate(req: corral.AuthRequest) -> str:
        seen.append(req)
        return "svc:webhook"  # whoever the caller claims to be

    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES, authorize=authenticate) as rt:
        ref = rt.ref(Ticket, key)
        await ref.signal_with_start(Ticket.reply, Reply(text="x"), start=START,
                                    sender="admin", message_id="m-1")
        await ref.update(Ticket.assign, Assign(agent="a"), sender="root", update_id="u-1")
        # A retry claiming yet another identity is still the same authenticated sender.
        dup = await ref.signal(Ticket.reply, Reply(text="x"), sender="mallory", message_id="m-1")

    assert dup.status == "duplicate"
    assert [(r.sender, r.entity_type, r.key, r.kind, r.name) for r in seen] == [
        ("admin", "Ticket", key, "signal", "reply"),
        ("root", "Ticket", key, "update", "assign"),
        ("mallory", "Ticket", key, "signal", "reply"),
    ]
    assert sql(db_path, "SELECT message_id, sender FROM journal WHERE key=? ORDER BY seq",
               key) == [("m-1", "svc:webhook"), ("u-1", "svc:webhook")]
    assert sql(db_path, "SELECT message_id, sender FROM dedupe WHERE key=? "
               "ORDER BY message_id", key) == [("m-1", "svc:webhook"),
                                               ("u-1", "svc:webhook")]


async def test_authorize_returning_none_records_an_anonymous_sender(db_path: str) -> None:
    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES,
                                   authorize=lambda req: None) as rt:
        await rt.ref(Ticket, key).signal_with_start(Ticket.reply, Reply(text="x"), start=START,
                                                    sender="admin")
    assert sql(db_path, "SELECT sender FROM journal WHERE key=?", key) == [(None,)]


async def test_an_async_authorize_works(db_path: str) -> None:
    async def authorize(req: corral.AuthRequest) -> str | bool:
        await asyncio.sleep(0)  # e.g. a token lookup
        if req.sender == "bob":
            return False
        return f"verified:{req.sender}"

    key = fresh_key()
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES, authorize=authorize) as rt:
        ref = rt.ref(Ticket, key)
        await ref.signal_with_start(Ticket.reply, Reply(text="x"), start=START, sender="alice")
        before = store_rows(db_path)
        with pytest.raises(corral.UnauthorizedError):
            await ref.signal(Ticket.reply, Reply(text="y"), sender="bob")
        assert store_rows(db_path) == before
    assert sql(db_path, "SELECT sender FROM journal WHERE key=?", key) == [
        ("verified:alice",)]


async def test_a_misspelt_field_is_named_along_with_the_missing_one(db_path: str) -> None:
    async with corral.open_runtime(db_path, entities=ALL_ENTITIES) as rt:
        with pytest.raises(corral.InvalidPayloadError) as caught:
            await rt.ref(Ticket, fresh_key()).signal_with_start(
                Ticket.reply, {"txet": "hi"}, start=START)
    text = str(caught.value)
    assert "unknown field(s) 'txet'" in text
    assert "text\n  Field required" in text


async def test_ref_hands_back_the_same_immutable_ref_and_never_skips_the_key_check(
        tmp_path: Any) -> None:
    """`Runtime.ref` keeps the refs it built: the same type and key give the same ref,
    which cannot be changed (callers share it); a key it has not seen is checked, and
    a str subclass that claims to equal a known key is not taken for it."""

    class Sly(str):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = str.__hash__

    async with corral.open_runtime(str(tmp_path / "refs.db"), entities=[Ticket]) as rt:
        ref = rt.ref(Ticket, "t-1")
        assert rt.ref(Ticket, "t-1") is ref
        assert rt.ref("Ticket", "t-1").key == "t-1"
        with pytest.raises(AttributeError):
            ref.key = "t-2"  # type: ignore[misc]
        assert ref.key == "t-1"
        with pytest.raises(corral.InvalidKeyError):
            rt.ref(Ticket, "t-1\x00")
        sly = rt.ref(Ticket, Sly("t-9"))
        assert sly is not ref
        assert str.__str__(sly.key) == "t-9"
        other = rt.ref(Ticket, "t-2")
        assert (other.key, other is ref) == ("t-2", False)
