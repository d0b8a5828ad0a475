"""Property-based tests (hypothesis) of the public API (issue 7, item 5).

Part 1 throws hostile input at every public call (`rt.ref`, `signal_with_start`,
`signal`, `update_with_start`, `update`): lone surrogates, control characters, huge
strings, deep nesting, NaN and infinities, bytes, non-string dict keys, instances
mutated after construction and `model_construct` with wrong types or missing fields.
Each hostile call runs among concurrent valid sends on the same runtime, so they share
group-commit batches. Properties: the hostile call is answered (an `Ack` or the
update's result) or refused with a `CorralError` raised at the boundary; a refused call
writes no row; every valid call succeeds and is applied exactly once.

Part 2 is a stateful test: a `Ledger` that continues as new every few messages,
passivates when idle and is restarted at random, checked against a plain integer after
every step.

Budget: about a minute on a slow 2-core machine. For a long run set
`CORRAL_HYPOTHESIS_PROFILE=long` (20x the examples, longer programs) or
`CORRAL_HYPOTHESIS_EXAMPLES=N` (N examples per test). Nothing is written to the working
tree: the example database is off and every example opens its own store in a temp dir.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import reprlib
import shutil
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import Phase, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import corral
from procs import wait_until
from property_entities import Amount, Box, BoxStart, Count, Item, Ledger, Node, RollIn, Total

# -- budget --------------------------------------------------------------------------

LONG = os.environ.get("CORRAL_HYPOTHESIS_PROFILE", "") == "long"


def examples(default: int) -> int:
    """Examples per test: `default`, 20x in the long profile, or the explicit override."""
    explicit = os.environ.get("CORRAL_HYPOTHESIS_EXAMPLES")
    if explicit:
        return int(explicit)
    return default * 20 if LONG else default


if LONG or os.environ.get("CORRAL_HYPOTHESIS_EXAMPLES"):
    pytestmark = pytest.mark.timeout(3600)  # a long run outlasts the 120 s default

# A short run reports a failure as found (shrinking a stuck call can take minutes);
# the long profile shrinks.
BOUNDARY_SETTINGS = settings(max_examples=examples(50), deadline=None, database=None,
                             print_blob=True,
                             phases=list(Phase) if LONG else [p for p in Phase
                                                              if p is not Phase.shrink])

# -- hostile values ------------------------------------------------------------------

LIMIT = 512  # bytes of canonical JSON: "huge" stays cheap
KEY_LENGTH = 64
LIMITS = corral.Limits(max_payload_bytes=LIMIT, max_key_length=KEY_LENGTH)


class Patience:
    """How long a call may take before it counts as stuck. Calls take milliseconds, so
    10 s; after a call got stuck, 1 s for the rest of that test: hypothesis replays a
    failing example many times while shrinking it, a stuck call stays stuck, and the
    test stays short."""

    _lost_in: str | None = None

    @staticmethod
    def _test() -> str:
        return os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]

    @classmethod
    def seconds(cls) -> float:
        return 1.0 if cls._lost_in == cls._test() else 10.0

    @classmethod
    def lost(cls) -> None:
        cls._lost_in = cls._test()


_short = reprlib.Repr()
_short.maxstring = _short.maxother = 120
_short.maxlevel = 4


def short_repr(value: Any) -> str:
    try:
        return _short.repr(value)
    except RecursionError:
        return f"<a {type(value).__name__} too deep to print>"


class Made:
    """A value for one call and the recipe that shows it (a 3000-deep value or a
    `model_construct` chain cannot be printed by `repr`; a plain class, because
    hypothesis prints a dataclass field by field)."""

    __slots__ = ("recipe", "value")

    def __init__(self, recipe: str, value: Any) -> None:
        self.recipe = recipe
        self.value = value

    def __repr__(self) -> str:
        return self.recipe


def plain(value: Any) -> Made:
    return Made(short_repr(value), value)


SURROGATES = ["\ud800", "\udbff", "\udc00", "\udfff", "a\ud83db", "\ud83d"]
ODD_STRINGS = ["", " ", "\x00", "\n", "\t", "\r\n", "\x1b[31m", "\x7f", "\x85", "\u2028",
               "\ufeff", "\u200b", "é", "😀", "a b", "a\x00b", *SURROGATES]

ODD_TEXT = st.one_of(
    st.text(alphabet=st.characters(codec=None), max_size=12),
    st.text(alphabet=st.characters(codec=None, categories=["Cc", "Cf", "Cs", "Zl", "Zp", "Zs"]),
            min_size=1, max_size=6),
    st.sampled_from(ODD_STRINGS),
)


@st.composite
def huge_text(draw: st.DrawFn, *, around: int = LIMIT) -> str:
    """A string whose UTF-8 size is near or above `around` bytes."""
    char = draw(st.sampled_from(["x", "é", "€", "😀", "\x00", "\ud800"]))
    width = len(char.encode("utf-8", "surrogatepass"))
    count = around // width + draw(st.integers(-24, 2 * around // width))
    return char * max(count, 1)


LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.sampled_from([2**64, -(2**80), 10**300]),
    st.floats(), st.sampled_from([float("nan"), float("inf"), float("-inf"), -0.0, 1e308]),
    st.binary(max_size=6), st.sampled_from([b"\xff", b"\x80abc", b"ok"]),
    ODD_TEXT, huge_text(), st.builds(object), st.sampled_from([{1, 2}, frozenset({"a"})]),
)
DICT_KEYS = st.one_of(ODD_TEXT, st.integers(), st.none(), st.booleans(), st.floats(),
                      st.tuples(st.integers()), st.binary(max_size=3))
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(DICT_KEYS, inner, max_size=4)),
    max_leaves=8,
)


def mutated(model: type[Any], fields: dict[str, Any], changes: dict[str, Any]) -> Made:
    """A valid instance with fields assigned afterwards (pydantic does not check them)."""
    instance = model(**fields)
    for attr, value in changes.items():
        setattr(instance, attr, value)
    return Made(f"<{model.__name__}(**{short_repr(fields)}) then {short_repr(changes)} "
                "assigned>", instance)


def nested(depth: int, shape: str) -> Made:
    """A plain value nested `depth` levels (built iteratively: no recursion here)."""
    value: Any = "leaf"
    for level in range(depth):
        as_list = shape == "list" or (shape == "mixed" and level % 2)
        value = [value] if as_list else {"k": value}
    return Made(f"<{shape} nested {depth} deep>", value)


def node_chain(depth: int, how: str) -> Made:
    """A `Node` chain `depth` deep: as dicts, as validated instances, or unvalidated
    (`model_construct`), optionally with a wrong-typed leaf."""
    value: Any = {"label": "leaf"} if how == "dict" else Node(label="leaf")
    if how == "construct-bad-leaf":
        value = Node.model_construct(label=["not", "a", "str"])
    for _ in range(depth):
        if how == "dict":
            value = {"child": value}
        elif how == "instance":
            value = Node(child=value)
        else:
            value = Node.model_construct(child=value)
    return Made(f"<Node chain {depth} deep, {how}>", value)


DEEP = st.one_of(
    st.builds(nested, st.integers(10, 3000), st.sampled_from(["list", "dict", "mixed"])),
    st.builds(nested, st.integers(200, 1200), st.sampled_from(["list", "dict", "mixed"])),
)
DEEP_NODES = st.builds(node_chain, st.integers(10, 3000),
                       st.sampled_from(["dict", "instance", "construct", "construct-bad-leaf"]))


@st.composite
def model_payloads(draw: st.DrawFn, model: type[Any], required: str, any_field: str,
                   typed: dict[str, Any]) -> Made:
    """Hostile payloads for `model`: dicts, valid instances holding odd values, instances
    mutated after construction, `model_construct` with wrong or missing fields, deep
    nesting, huge strings, and things that are not models at all."""
    name = model.__name__
    form = draw(st.sampled_from(["dict", "instance", "mutated", "construct", "deep",
                                 "deep-node", "huge", "not-a-model"]))
    if form == "deep-node" and "node" not in typed:
        form = "deep"
    if form == "dict":
        fields = draw(st.dictionaries(st.sampled_from([any_field, *typed]),
                                      st.one_of(VALUES, ODD_TEXT), max_size=3))
        unknown = draw(st.dictionaries(DICT_KEYS, VALUES, max_size=2))
        if draw(st.booleans()):
            fields[required] = draw(st.one_of(ODD_TEXT, VALUES))
        payload = {**unknown, **fields}
        return plain(payload)
    if form == "instance":  # validated when built, but holding odd values
        ident = draw(st.one_of(st.just("p-1"), ODD_TEXT, huge_text()))
        return plain(model(**{required: ident, any_field: draw(VALUES)}))
    if form == "mutated":
        changes = draw(st.dictionaries(st.sampled_from([required, any_field, *typed]),
                                       st.one_of(VALUES, ODD_TEXT), min_size=1, max_size=3))
        return mutated(model, {required: "p-1"}, changes)
    if form == "construct":
        fields = draw(st.dictionaries(st.sampled_from([required, any_field, *typed]),
                                      st.one_of(VALUES, ODD_TEXT), max_size=3))
        return Made(f"{name}.model_construct(**{short_repr(fields)})",
                    model.model_construct(**fields))
    if form == "deep":
        deep = draw(DEEP)
        as_dict = draw(st.booleans())
        fields = {required: "p-1", any_field: deep.value}
        value = fields if as_dict else model(**fields)
        return Made(f"<{name} {'dict' if as_dict else 'instance'}: {any_field}={deep}>",
                    value)
    if form == "deep-node":
        chain = draw(DEEP_NODES)
        how = draw(st.sampled_from(["dict", "construct"]))
        if how == "dict":
            value = {required: "p-1", "node": chain.value}
        else:
            value = model.model_construct(**{required: "p-1", "node": chain.value})
        return Made(f"<{name} {how}: node={chain}>", value)
    if form == "huge":
        text = draw(huge_text())
        target = draw(st.sampled_from([required, *[f for f, t in typed.items() if t is str]]))
        as_dict = draw(st.booleans())
        fields = {required: "p-1", target: text}
        recipe = f"<{name} {'dict' if as_dict else 'instance'}: {target}={short_repr(text)} " \
                 f"({len(text)} chars)>"
        return Made(recipe, fields if as_dict else model(**fields))
    return plain(draw(st.one_of(VALUES, st.just(Amount(n=1)), st.just(RollIn()))))


ITEM_PAYLOADS = model_payloads(Item, "mid", "value",
                               {"text": str, "n": int, "x": float, "node": Node})
START_INPUTS = model_payloads(BoxStart, "tenant", "extra", {})

IDENTIFIERS = st.one_of(
    ODD_TEXT,
    st.text(max_size=20),
    st.builds(lambda c, n: c * n, st.sampled_from(["m", "é", "\ud800"]),
              st.integers(KEY_LENGTH - 2, KEY_LENGTH + 2)),
    st.integers(), st.none(), st.binary(max_size=4), st.sampled_from([["m"], 1.5, True]),
).map(plain)

KEYS = st.one_of(
    IDENTIFIERS,
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:@/+=#-]{0,70}", fullmatch=True).map(plain),
)

# -- calls ---------------------------------------------------------------------------

METHODS = ("signal_with_start", "signal", "update_with_start", "update")
WITH_START = ("signal_with_start", "update_with_start")
START = BoxStart(tenant="acme")


class Call:
    """One send: which method, to which key, with which arguments (`ident` is the
    message id or update id)."""

    __slots__ = ("ident", "key", "method", "payload", "sender", "start")

    def __init__(self, method: str, key: Made, payload: Made, *, start: Made | None = None,
                 ident: Made | None = None, sender: Made | None = None) -> None:
        self.method = method
        self.key = key
        self.payload = payload
        self.start = plain(START) if start is None else start
        self.ident = plain(None) if ident is None else ident
        self.sender = plain(None) if sender is None else sender

    def but(self, slot: str, value: Made) -> Call:
        """This call with one argument replaced."""
        args = {name: getattr(self, name) for name in ("start", "ident", "sender")}
        call = Call(self.method, self.key, self.payload, **args)
        setattr(call, slot, value)
        return call

    def __repr__(self) -> str:
        return (f"Call({self.method}, key={self.key}, payload={self.payload}, "
                f"start={self.start}, id={self.ident}, sender={self.sender})")

    async def send(self, rt: corral.Runtime) -> Any:
        ref = rt.ref(Box, self.key.value)
        payload, ident, sender = self.payload.value, self.ident.value, self.sender.value
        if self.method == "signal_with_start":
            return await ref.signal_with_start(Box.put, payload, start=self.start.value,
                                               message_id=ident, sender=sender)
        if self.method == "signal":
            return await ref.signal(Box.put, payload, message_id=ident, sender=sender)
        if self.method == "update_with_start":
            return await ref.update_with_start(Box.put_and_count, payload,
                                               start=self.start.value, update_id=ident,
                                               sender=sender, timeout=Patience.seconds())
        return await ref.update(Box.put_and_count, payload, update_id=ident, sender=sender,
                                timeout=Patience.seconds())


SHARED = "box-shared"  # no hostile strategy draws this exact key


def valid_call(method: str, key: str, mid: str) -> Call:
    return Call(method, plain(key), plain(Item(mid=mid)), ident=plain(mid))


@st.composite
def hostile_calls(draw: st.DrawFn, slot: str) -> Call:
    """A call whose `slot` argument is hostile and whose other arguments are valid."""
    methods = WITH_START if slot == "start" else METHODS
    method = draw(st.sampled_from(methods))
    key = draw(st.sampled_from([SHARED, "box-new"]))  # each example has its own store
    call = Call(method, plain(key), plain(Item(mid="hostile")))
    strategy = {"key": KEYS, "payload": ITEM_PAYLOADS, "start": START_INPUTS}.get(
        slot, IDENTIFIERS)
    return call.but(slot, draw(strategy))


# The valid batch mates: a method and whether it goes to the shared (running) entity or
# starts a fresh one (only the *_with_start methods can).
MATES = st.lists(st.one_of(st.tuples(st.sampled_from(METHODS), st.just("shared")),
                           st.tuples(st.sampled_from(WITH_START), st.just("fresh"))),
                 min_size=3, max_size=8)
POSITION = st.integers(0, 8)

COUNTED = ("dead_letters", "dedupe", "entities", "journal", "runs", "snapshots")


def row_counts(path: str) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return {t: db.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in COUNTED}


def entity_keys(path: str) -> set[str]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return {k for (k,) in db.execute("SELECT key FROM entities")}


def answered(result: object) -> bool:
    """An answer rather than an error: an Ack or an update's result."""
    return isinstance(result, corral.Ack | Count)


def new_rows(result: object) -> bool:
    """Whether an answered call added a journal row (a duplicate adds none)."""
    return isinstance(result, Count) or (isinstance(result, corral.Ack)
                                         and result.status == "accepted")


def describe_error(err: BaseException) -> str:
    return f"{type(err).__module__}.{type(err).__qualname__}: {short_repr(str(err))}"


async def hostile_among_valid(path: str, hostile: Call, mates: list[tuple[str, str]],
                              position: int) -> None:
    valid = [valid_call(method, SHARED if target == "shared" else f"fresh-{i}", f"ok-{i}")
             for i, (method, target) in enumerate(mates)]
    calls = list(valid)
    calls.insert(min(position, len(calls)), hostile)
    async with corral.open_runtime(path, entities=[Box], limits=LIMITS) as rt:
        await rt.ref(Box, SHARED).signal_with_start(Box.put, Item(mid="seed"), start=START,
                                                    message_id="seed")
        before, keys_before = row_counts(path), entity_keys(path)

        results = await asyncio.wait_for(
            asyncio.gather(*(c.send(rt) for c in calls), return_exceptions=True),
            2 * Patience.seconds())
        if any(isinstance(r, TimeoutError) for r in results):
            Patience.lost()
        outcome = dict(zip([id(c) for c in calls], results, strict=True))

        # 1. Every valid call succeeded, whatever shared its batch.
        failed = [(c, describe_error(r)) for c, r in zip(calls, results, strict=True)
                  if c is not hostile and isinstance(r, BaseException)]
        assert not failed, f"valid calls failed next to {hostile!r}: {failed}"
        for c in valid:
            result = outcome[id(c)]
            assert new_rows(result), f"{c!r} answered {result!r}"
            if isinstance(result, corral.Ack):  # each fresh key has one sender: it starts
                assert result.started == (c.key.value != SHARED), f"{c!r} answered {result!r}"
        # 2. The hostile call was answered or refused at the boundary with a CorralError.
        got = outcome[id(hostile)]
        event(f"hostile call: {type(got).__name__}")
        if isinstance(got, BaseException):
            assert not isinstance(got, TimeoutError), \
                f"{hostile!r} got stuck: {describe_error(got)}"
            assert isinstance(got, corral.CorralError), \
                f"{hostile!r} raised {describe_error(got)}, not a CorralError"
            assert not isinstance(got, corral.StoreError), \
                f"{hostile!r} reached the store: {describe_error(got)}"
            assert str(got)
        else:
            assert answered(got), f"{hostile!r} answered {got!r}"

        # 3. Each valid call was applied exactly once (a query waits for everything
        #    accepted); the hostile one at most once, if it was answered.
        hostile_key = hostile.key.value
        targets = {c.key.value for c in valid} | ({hostile_key} if answered(got) else set())
        applied = {key: await rt.ref(Box, key).query(Box.applied) for key in targets}
        for c in valid:
            mids = Counter(applied[c.key.value])
            assert mids[c.payload.value.mid] == 1, \
                f"{c!r} applied {mids[c.payload.value.mid]} times next to {hostile!r}"
        for key, mids in applied.items():
            expected = (key == SHARED) + sum(c.key.value == key for c in valid) \
                + (new_rows(got) and key == hostile_key)
            assert len(mids) == expected, f"{key}: applied {mids}, expected {expected} items"

        # 4. Rows: one journal and one dedupe row per accepted call, one entity and one run
        #    per new key; nothing else. A refused call wrote nothing.
        after, keys_after = row_counts(path), entity_keys(path)
        accepted = len(valid) + new_rows(got)
        started = {c.key.value for c in valid} - keys_before
        if new_rows(got) and hostile_key not in keys_before:
            started.add(hostile_key)
        assert keys_after - keys_before == started
        assert after == {**before,
                         "journal": before["journal"] + accepted,
                         "dedupe": before["dedupe"] + accepted,
                         "entities": before["entities"] + len(started),
                         "runs": before["runs"] + len(started)}, \
            f"rows changed unexpectedly around {hostile!r} (answered {got!r})"


def check_hostile_among_valid(hostile: Call, mates: list[tuple[str, str]],
                              position: int) -> None:
    with tempfile.TemporaryDirectory(prefix="corral-prop-") as tmp:
        asyncio.run(hostile_among_valid(os.path.join(tmp, "corral.db"), hostile, mates,
                                        position))


MIX = [("signal_with_start", "shared"), ("update", "shared"), ("signal", "shared"),
       ("update_with_start", "fresh"), ("signal_with_start", "fresh")]


def hostile(slot: str, value: Made, method: str = "signal_with_start",
            key: str = SHARED) -> Call:
    return Call(method, plain(key), plain(Item(mid="hostile"))).but(slot, value)


@BOUNDARY_SETTINGS
@given(call=hostile_calls("payload"), mates=MATES, position=POSITION)
@example(hostile("payload", plain({"mid": "\ud800"})), MIX, 2)
@example(hostile("payload", plain(Item(mid="a", text="x\udfff")), "update"), MIX, 1)
@example(hostile("payload", Made("Item(mid=...)",
                                 Item(mid="a", value={"k\ud800": 1}))), MIX, 0)
@example(hostile("payload", nested(3000, "list")), MIX, 2)
@example(hostile("payload", nested(3000, "dict"), "update_with_start"), MIX, 2)
@example(hostile("payload", Made("{'mid': 'a', 'node': <Node chain 3000 deep, dict>}",
                                 {"mid": "a", "node": node_chain(3000, "dict").value})),
         MIX, 3)
@example(hostile("payload", Made("Item.model_construct(node=<Node chain 3000 deep>)",
                                 Item.model_construct(
                                     mid="a", node=node_chain(3000, "construct").value))),
         MIX, 3)
@example(hostile("payload", Made("Item.model_construct(node=<bad leaf 20 deep>)",
                                 Item.model_construct(
                                     mid="a", node=node_chain(20, "construct-bad-leaf").value))),
         MIX, 3)
@example(hostile("payload", Made("Item.model_construct(mid=5)", Item.model_construct(mid=5))),
         MIX, 1)
@example(hostile("payload", Made("Item.model_construct()", Item.model_construct())), MIX, 1)
@example(hostile("payload", Made("{'mid': 'a', 'node': Node.model_construct(label=[...])}",
                                 {"mid": "a", "node": node_chain(0, "construct-bad-leaf").value})),
         MIX, 1)
@example(hostile("payload", Made("{'mid': 'a', 'node': <bad leaf 3 deep, construct>}",
                                 {"mid": "a", "node": node_chain(3, "construct-bad-leaf").value}),
                 "update"), MIX, 1)
@example(hostile("payload", mutated(Item, {"mid": "a"}, {"n": "x"})), MIX, 1)
@example(hostile("payload", mutated(Item, {"mid": "a"}, {"mid": "\ud800"}), "update"), MIX, 1)
@example(hostile("payload", plain({"mid": "a", "x": float("nan")}), "update"), MIX, 1)
@example(hostile("payload", plain({"mid": "a", "value": {1: "one"}})), MIX, 1)
@example(hostile("payload", plain({"mid": "a", "value": b"\xff"})), MIX, 1)
def test_any_payload_is_answered_or_refused_with_a_corral_error_and_never_disturbs_its_batch(
        call: Call, mates: list[tuple[str, str]], position: int) -> None:
    check_hostile_among_valid(call, mates, position)


@BOUNDARY_SETTINGS
@given(call=hostile_calls("start"), mates=MATES, position=POSITION)
@example(hostile("start", mutated(BoxStart, {"tenant": "a"}, {"tenant": 5})), MIX, 1)
@example(hostile("start", Made("BoxStart.model_construct(tenant=5)",
                               BoxStart.model_construct(tenant=5))), MIX, 1)
@example(hostile("start", Made("BoxStart.model_construct()", BoxStart.model_construct()),
                 "update_with_start", "box-new"), MIX, 1)
@example(hostile("start", plain({"tenant": "\ud800"}), key="box-new"), MIX, 1)
@example(hostile("start", Made("<BoxStart, extra nested 3000>",
                               BoxStart(tenant="a", extra=nested(3000, "mixed").value)),
                 key="box-new"), MIX, 1)
@example(hostile("start", plain(BoxStart(tenant="t" * (LIMIT + 1))), key="box-new"), MIX, 0)
def test_any_start_input_is_answered_or_refused_with_a_corral_error_and_never_disturbs_its_batch(
        call: Call, mates: list[tuple[str, str]], position: int) -> None:
    check_hostile_among_valid(call, mates, position)


@BOUNDARY_SETTINGS
@given(call=hostile_calls("ident"), mates=MATES, position=POSITION)
@example(hostile("ident", plain("\ud800")), MIX, 2)
@example(hostile("ident", plain("m-\udfff"), "update"), MIX, 2)
@example(hostile("ident", plain("m\u2028"), "update_with_start"), MIX, 2)
@example(hostile("ident", plain("é" * (KEY_LENGTH + 1))), MIX, 2)
def test_any_message_or_update_id_is_answered_or_refused_with_a_corral_error_and_never_disturbs_its_batch(  # noqa: E501
        call: Call, mates: list[tuple[str, str]], position: int) -> None:
    check_hostile_among_valid(call, mates, position)


@BOUNDARY_SETTINGS
@given(call=hostile_calls("sender"), mates=MATES, position=POSITION)
@example(hostile("sender", plain("\ud800")), MIX, 2)
@example(hostile("sender", plain("eve\udfff"), "update"), MIX, 2)
@example(hostile("sender", plain("\x00")), MIX, 2)
@example(hostile("sender", plain(b"eve")), MIX, 2)
def test_any_sender_is_answered_or_refused_with_a_corral_error_and_never_disturbs_its_batch(
        call: Call, mates: list[tuple[str, str]], position: int) -> None:
    check_hostile_among_valid(call, mates, position)


@BOUNDARY_SETTINGS
@given(call=hostile_calls("key"), mates=MATES, position=POSITION)
@example(hostile("key", plain("\ud800")), MIX, 2)
@example(hostile("key", plain("a\x00b"), "update_with_start"), MIX, 2)
@example(hostile("key", plain("k" * KEY_LENGTH), "update_with_start"), MIX, 2)
@example(hostile("key", plain(None)), MIX, 2)
def test_any_entity_key_is_answered_or_refused_with_a_corral_error_and_never_disturbs_its_batch(
        call: Call, mates: list[tuple[str, str]], position: int) -> None:
    check_hostile_among_valid(call, mates, position)


@settings(max_examples=examples(60), deadline=None, database=None)
@given(key=KEYS)
def test_ref_either_addresses_the_key_as_given_or_raises_invalid_key_error(key: Made) -> None:
    async def scenario(path: str) -> None:
        async with corral.open_runtime(path, entities=[Box], limits=LIMITS) as rt:
            try:
                ref = rt.ref(Box, key.value)
            except corral.InvalidKeyError:
                return
            assert ref.key == key.value
            assert isinstance(key.value, str)
            ack = await ref.signal_with_start(Box.put, Item(mid="m"), start=START)
            assert (ack.status, ack.started) == ("accepted", True)
            assert (await ref.describe()).key == key.value
        assert entity_keys(path) == {key.value}

    with tempfile.TemporaryDirectory(prefix="corral-prop-") as tmp:
        asyncio.run(scenario(os.path.join(tmp, "corral.db")))


# -- part 2: a stateful ledger -------------------------------------------------------


@dataclass(frozen=True)
class SentSignal:
    mid: str
    amount: int
    ack: corral.Ack | None  # None: sent after an earlier step failed (nothing was sent)


@dataclass(frozen=True)
class SentUpdate:
    uid: str
    amount: int
    result: Total | None


Step = Callable[..., Any]


def step(placeholder: Callable[[], Any] = lambda: None) -> Callable[[Step], Step]:
    """Run a rule or invariant unless an earlier step failed; keep its failure for
    `teardown`, which raises it.

    Timing decides where a race shows (a query issued while the entity switches runs
    or passivates): raising at once would end the program at a different step on each
    replay, which hypothesis reports as flaky data generation instead of the bug. So
    every step still runs (and draws) and the first failure is raised at the end.
    """

    def decorate(fn: Step) -> Step:
        @functools.wraps(fn)
        def guarded(self: LedgerMachine, **kwargs: Any) -> Any:
            if self.failure is None:
                try:
                    return fn(self, **kwargs)
                except Exception as err:
                    self.failure = (f"{fn.__name__}({short_repr(kwargs)[1:-1]})", err)
            return placeholder()

        return guarded

    return decorate


class LedgerMachine(RuleBasedStateMachine):
    """A `Ledger` against a plain integer: signals, updates (alone and in concurrent
    bursts), resent ids, continue-as-new every `every` messages, passivation and host
    restarts on one store file."""

    signals = Bundle("signals")
    updates = Bundle("updates")

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="corral-ledger-")
        self.path = os.path.join(self.dir, "ledger.db")
        self.loop = asyncio.new_event_loop()
        self.stack: contextlib.AsyncExitStack | None = None
        self.rt: corral.Runtime | None = None
        self.failure: tuple[str, Exception] | None = None
        self.ids = itertools.count()
        self.total = 0  # the model
        self.every = 3
        self.started = False
        self.restarts = 0
        self.run(self._open())

    # -- plumbing ---------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        timeout = Patience.seconds()
        try:
            return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))
        except asyncio.TimeoutError:  # not the builtin before 3.11
            Patience.lost()
            raise AssertionError(f"{coro.__qualname__} got no answer in {timeout} s (a call "
                                 "got stuck before, so no longer 10 s); the ledger: "
                                 f"{self._describe_briefly()}") from None

    def _describe_briefly(self) -> str:
        if self.rt is None or not self.started:
            return "not started"
        try:
            info = self.loop.run_until_complete(asyncio.wait_for(self.ref.describe(), 5))
        except Exception as err:
            return f"describe() failed too: {err!r}"
        return (f"run {info.run_id} ({len(info.runs)} runs), accepted_seq {info.accepted_seq}, "
                f"applied_seq {info.applied_seq}, hosted_here {info.hosted_here}; model total "
                f"{self.total}")

    async def _open(self) -> None:
        stack = contextlib.AsyncExitStack()
        self.rt = await stack.enter_async_context(
            corral.open_runtime(self.path, entities=[Ledger]))
        self.stack = stack

    async def _close(self) -> None:
        stack, self.stack, self.rt = self.stack, None, None
        if stack is not None:
            await stack.aclose()

    @property
    def ref(self) -> corral.EntityRef[Ledger]:
        assert self.rt is not None
        return self.rt.ref(Ledger, "ledger-1")

    def fresh_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self.ids)}"

    def start_input(self) -> RollIn:
        return RollIn(total=0, every=self.every)  # used only by the first start

    async def _signal(self, mid: str, amount: int, *, plain_signal: bool) -> corral.Ack:
        if plain_signal:
            return await self.ref.signal(Ledger.add, Amount(n=amount), message_id=mid)
        return await self.ref.signal_with_start(Ledger.add, Amount(n=amount),
                                                start=self.start_input(), message_id=mid)

    async def _update(self, uid: str, amount: int, *, plain_update: bool) -> Total:
        if plain_update:
            return await self.ref.update(Ledger.add_and_get, Amount(n=amount), update_id=uid,
                                         timeout=Patience.seconds())
        return await self.ref.update_with_start(Ledger.add_and_get, Amount(n=amount),
                                                start=self.start_input(), update_id=uid,
                                                timeout=Patience.seconds())

    def teardown(self) -> None:
        try:
            if self.failure is None:
                self.run(self._close())
            else:  # the runtime may be stuck: do not let closing it hide the failure
                with contextlib.suppress(Exception):
                    self.run(self._close())
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)
        if self.failure is not None:
            where, err = self.failure
            raise AssertionError(f"step {where} failed: {type(err).__name__}: {err}") from err

    # -- rules ------------------------------------------------------------------------

    @initialize(every=st.integers(1, 6))
    def choose_how_often_to_continue_as_new(self, every: int) -> None:
        self.every = every

    @rule(target=signals, amount=st.integers(1, 100), plain_signal=st.booleans())
    @step(lambda: SentSignal("", 0, None))
    def send_a_signal(self, amount: int, plain_signal: bool) -> SentSignal:
        mid = self.fresh_id("s")
        was_started, self.started = self.started, True
        ack = self.run(self._signal(mid, amount, plain_signal=plain_signal and was_started))
        assert ack.status == "accepted", ack
        assert ack.started == (not was_started), ack
        self.total += amount
        return SentSignal(mid, amount, ack)

    @rule(sent=signals, plain_signal=st.booleans())
    @step()
    def resend_a_signal(self, sent: SentSignal, plain_signal: bool) -> None:
        again = self.run(self._signal(sent.mid, sent.amount, plain_signal=plain_signal))
        assert sent.ack is not None
        assert (again.status, again.run_id, again.seq) == \
            ("duplicate", sent.ack.run_id, sent.ack.seq), f"{again} for {sent}"

    @rule(target=updates, amount=st.integers(1, 100), plain_update=st.booleans())
    @step(lambda: SentUpdate("", 0, None))
    def send_an_update(self, amount: int, plain_update: bool) -> SentUpdate:
        uid = self.fresh_id("u")
        was_started, self.started = self.started, True
        result = self.run(self._update(uid, amount, plain_update=plain_update and was_started))
        self.total += amount
        assert result == Total(total=self.total), f"update {uid} of {amount}"
        return SentUpdate(uid, amount, result)

    @rule(sent=updates, plain_update=st.booleans())
    @step()
    def resend_an_update(self, sent: SentUpdate, plain_update: bool) -> None:
        again = self.run(self._update(sent.uid, sent.amount, plain_update=plain_update))
        assert again == sent.result, f"a resent update {sent.uid} answered {again}"

    @rule(amounts=st.lists(st.integers(1, 50), min_size=2, max_size=12))
    @step()
    def send_a_burst_of_concurrent_updates(self, amounts: list[int]) -> None:
        uids = [self.fresh_id("u") for _ in amounts]
        self.started = True

        async def burst() -> list[Total]:
            return list(await asyncio.gather(*(
                self._update(uid, n, plain_update=False)
                for uid, n in zip(uids, amounts, strict=True))))

        results = self.run(burst())
        # Applied one after another: sorted by the total each saw, every update added
        # exactly its own amount to the one before (no update lost, none applied twice).
        running = self.total
        for got, amount in sorted(zip((r.total for r in results), amounts, strict=True)):
            running += amount
            assert got == running, f"burst {amounts} from {self.total} answered " \
                f"{[r.total for r in results]}"
        self.total = running

    @rule(amounts=st.lists(st.integers(1, 50), min_size=2, max_size=12),
          updates_too=st.lists(st.integers(1, 50), max_size=4))
    @step()
    def send_a_burst_of_concurrent_signals(self, amounts: list[int],
                                           updates_too: list[int]) -> None:
        mids = [self.fresh_id("s") for _ in amounts]
        uids = [self.fresh_id("u") for _ in updates_too]
        self.started = True

        async def burst() -> tuple[list[corral.Ack], list[Total]]:
            acks = asyncio.gather(*(self._signal(m, n, plain_signal=False)
                                    for m, n in zip(mids, amounts, strict=True)))
            totals = asyncio.gather(*(self._update(u, n, plain_update=False)
                                      for u, n in zip(uids, updates_too, strict=True)))
            return list(await acks), list(await totals)

        acks, totals = self.run(burst())
        assert [a.status for a in acks] == ["accepted"] * len(acks), acks
        assert len({a.seq for a in acks}) == len(acks), f"two signals share a seq: {acks}"
        assert len({t.total for t in totals}) == len(totals), f"updates saw {totals}"
        final = self.total + sum(amounts) + sum(updates_too)
        assert all(self.total + n <= t.total <= final
                   for n, t in zip(updates_too, totals, strict=True)), totals
        self.total = final

    @precondition(lambda self: self.started)
    @rule()
    @step()
    def wait_until_passivated(self) -> None:
        async def passivated() -> bool:
            return not (await self.ref.describe()).hosted_here

        self.run(wait_until(passivated, "the idle ledger is passivated", timeout=20))

    @rule(activate=st.booleans())
    @step()
    def restart_the_host(self, activate: bool) -> None:
        self.run(self._close())
        self.run(self._open())
        self.restarts += 1
        if activate and self.started:
            got = self.run(self.ref.query(Ledger.current, activate=True))
            assert got == Total(total=self.total), f"after restart {self.restarts}"

    @precondition(lambda self: self.started)
    @rule(activate=st.booleans())
    @step()
    def query(self, activate: bool) -> None:
        got = self.run(self.ref.query(Ledger.current, activate=activate))
        assert got == Total(total=self.total)

    # -- invariants -------------------------------------------------------------------

    @invariant()
    @step()
    def the_total_equals_the_model(self) -> None:
        if not self.started:
            return
        got = self.run(self.ref.query(Ledger.current))
        assert got == Total(total=self.total), f"ledger says {got.total}, model {self.total}"

    @invariant()
    @step()
    def the_runs_form_one_chain_ending_in_a_running_run_and_nothing_is_dead_lettered(
            self) -> None:
        if not self.started:
            return
        info = self.run(self.ref.describe())
        runs = info.runs
        assert [r.run_id for r in runs] == list(range(1, len(runs) + 1))
        assert [r.status for r in runs] == \
            [corral.RunStatus.CONTINUED] * (len(runs) - 1) + [corral.RunStatus.RUNNING]
        assert [r.continued_from for r in runs] == [None, *range(1, len(runs))]
        assert self.run(self.ref.dead_letters()) == []


def test_a_ledger_agrees_with_a_plain_model_through_continue_as_new_passivation_and_restarts(
        ) -> None:
    # A failing program replays slowly (its races are timing-dependent and a stuck step
    # waits out its timeout), so only the long profile shrinks it; the short one reports
    # the program as generated.
    phases = list(Phase) if LONG else [p for p in Phase if p is not Phase.shrink]
    run_state_machine_as_test(LedgerMachine, settings=settings(
        max_examples=examples(30), stateful_step_count=60 if LONG else 30, deadline=None,
        database=None, print_blob=True, phases=phases))
