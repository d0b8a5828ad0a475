"""Entity classes are validated when they are defined, with errors that say what to fix."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

import corral
from corral.actors import HandlerKind


class Msg(BaseModel):
    text: str


class Init(BaseModel):
    tenant: str


class Answer(BaseModel):
    value: int


def test_a_valid_entity_gets_a_definition_with_every_handler_and_its_models() -> None:
    class Good(corral.Entity):
        id_reuse = corral.IdReusePolicy.REJECT_DUPLICATE
        inbox = corral.signal(Msg)

        def __init__(self, init: Init) -> None:
            self.tenant = init.tenant

        @corral.signal
        def ping(self) -> None:
            pass

        @corral.signal
        def reply(self, msg: Msg) -> None:
            pass

        @corral.update
        async def ask(self, msg: Msg) -> Answer:
            return Answer(value=1)

        @corral.query
        def peek(self) -> Answer:
            return Answer(value=2)

        async def run(self) -> Answer:
            return Answer(value=3)

    d = Good._corral_definition
    assert d.name == "Good"
    assert d.start_type is Init
    assert d.result_type is Answer
    assert d.id_reuse is corral.IdReusePolicy.REJECT_DUPLICATE
    kinds = {name: (h.kind, h.input_type, h.fn is None) for name, h in d.handlers.items()}
    assert kinds == {
        "inbox": (HandlerKind.SIGNAL, Msg, True),
        "ping": (HandlerKind.SIGNAL, None, False),
        "reply": (HandlerKind.SIGNAL, Msg, False),
        "ask": (HandlerKind.UPDATE, Msg, False),
        "peek": (HandlerKind.QUERY, None, False),
    }
    assert d.handlers["ask"].is_async
    assert d.handlers["ask"].output_type is Answer


def test_a_subclass_inherits_handlers_and_may_change_its_policy() -> None:
    class Base(corral.Entity):
        @corral.signal
        def reply(self, msg: Msg) -> None:
            pass

    class Child(Base):
        id_reuse = corral.IdReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY

    assert set(Child._corral_definition.handlers) == {"reply"}
    assert Child._corral_definition.name == "Child"
    assert Child._corral_definition.id_reuse is corral.IdReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY
    assert Base._corral_definition.id_reuse is corral.IdReusePolicy.ALLOW_DUPLICATE


def test_a_handler_with_three_args_is_refused_at_class_definition() -> None:
    with pytest.raises(corral.EntityDefinitionError) as caught:

        class Bad(corral.Entity):
            @corral.signal
            def reply(self, a: Msg, b: Msg, c: Msg) -> None:
                pass

    text = str(caught.value)
    assert "signal handler `reply`" in text
    assert "one pydantic model or nothing" in text
    assert "got 3 args (a, b, c)" in text


def test_a_keyword_only_parameter_is_refused() -> None:
    with pytest.raises(corral.EntityDefinitionError, match=r"update handler `ask`.*one pydantic"):

        class Bad(corral.Entity):
            @corral.update
            def ask(self, *, msg: Msg) -> None:
                pass


@pytest.mark.parametrize("annotation", ["int", "str", "dict[str, Any]", "list[Msg]"])
def test_a_parameter_that_is_not_a_pydantic_model_is_refused(annotation: str) -> None:
    namespace: dict[str, Any] = {}
    source = (
        "class Bad(corral.Entity):\n"
        "    @corral.signal\n"
        f"    def reply(self, msg: {annotation}) -> None:\n"
        "        pass\n"
    )
    with pytest.raises(corral.EntityDefinitionError) as caught:
        exec(source, {"corral": corral, "Msg": Msg, "Any": Any}, namespace)
    text = str(caught.value)
    assert "signal handler `reply` of Bad" in text
    assert "parameter `msg` must be annotated with a pydantic BaseModel subclass" in text


def test_a_parameter_without_annotation_is_refused() -> None:
    with pytest.raises(corral.EntityDefinitionError, match="must be annotated with a pydantic"):

        class Bad(corral.Entity):
            @corral.signal
            def reply(self, msg) -> None:  # type: ignore[no-untyped-def]
                pass


def test_an_async_query_is_refused() -> None:
    with pytest.raises(corral.EntityDefinitionError) as caught:

        class Bad(corral.Entity):
            @corral.query
            async def peek(self) -> Answer:
                return Answer(value=1)

    assert "query handler `peek` must be a plain `def`" in str(caught.value)


def test_a_run_that_is_not_async_is_refused() -> None:
    with pytest.raises(corral.EntityDefinitionError) as caught:

        class Bad(corral.Entity):
            def run(self) -> None:  # type: ignore[override]
                pass

    assert "Bad.run must be `async def run(self)`" in str(caught.value)


@pytest.mark.parametrize("policy", ["reject_duplicate", None, 1, "REJECT_DUPLICATE"])
def test_an_id_reuse_that_is_not_an_IdReusePolicy_is_refused(policy: object) -> None:
    with pytest.raises(corral.EntityDefinitionError) as caught:
        type("Bad", (corral.Entity,), {"id_reuse": policy})
    text = str(caught.value)
    assert "Bad.id_reuse must be an IdReusePolicy" in text
    assert repr(policy) in text


def test_an_init_that_takes_something_other_than_one_model_is_refused() -> None:
    with pytest.raises(corral.EntityDefinitionError) as caught:

        class Bad(corral.Entity):
            def __init__(self, tenant: str) -> None:
                self.tenant = tenant

    assert "__init__ (the start input) of Bad" in str(caught.value)
    assert "parameter `tenant`" in str(caught.value)

    with pytest.raises(corral.EntityDefinitionError, match=r"got 2 args \(a, b\)"):

        class Bad2(corral.Entity):
            def __init__(self, a: Init, b: Init) -> None:
                pass


def test_an_annotation_that_cannot_be_resolved_says_to_define_the_model_first() -> None:
    with pytest.raises(corral.EntityDefinitionError) as caught:

        class Bad(corral.Entity):
            @corral.signal
            def reply(self, msg: NotDefinedAnywhere) -> None:  # type: ignore[name-defined]  # noqa: F821
                pass

    assert "cannot resolve annotation" in str(caught.value)
    assert "define the model before the entity class" in str(caught.value)


def test_a_name_that_is_not_an_identifier_is_refused() -> None:
    with pytest.raises(corral.EntityDefinitionError, match="name must be an identifier"):
        type("Bad", (corral.Entity,), {"name": "ticket agent"})


@pytest.mark.parametrize("decorator", [corral.update, corral.query])
def test_decorating_something_that_is_not_a_method_is_refused(decorator: Any) -> None:
    with pytest.raises(corral.EntityDefinitionError, match="decorates a method"):
        decorator(Msg)
    with pytest.raises(corral.EntityDefinitionError, match="decorates a method"):
        decorator(42)


def test_a_mailbox_signal_needs_a_pydantic_model() -> None:
    with pytest.raises(corral.EntityDefinitionError, match="pass a pydantic model class"):
        corral.signal(int)


def test_definition_errors_are_type_errors_and_corral_errors() -> None:
    assert issubclass(corral.EntityDefinitionError, TypeError)
    assert issubclass(corral.EntityDefinitionError, corral.CorralError)


# -- subclasses and overrides ------------------------------------------------------------


class Replying(corral.Entity):
    inbox = corral.signal(Msg)

    @corral.signal
    def reply(self, msg: Msg) -> None:
        pass

    @corral.update
    def ask(self, msg: Msg) -> Answer:
        return Answer(value=1)


def test_an_override_that_keeps_its_decorator_replaces_the_base_handler() -> None:
    class Child(Replying):
        @corral.update
        def ask(self, msg: Msg) -> Answer:
            return Answer(value=2)

    handler = Child._corral_definition.handlers["ask"]
    assert handler.fn is Child.__dict__["ask"]
    assert handler.kind is HandlerKind.UPDATE
    assert Replying._corral_definition.handlers["ask"].fn is Replying.__dict__["ask"]


def test_an_override_without_its_decorator_is_refused_saying_what_to_write() -> None:
    with pytest.raises(corral.EntityDefinitionError) as caught:

        class Child(Replying):
            def reply(self, msg: Msg) -> None:
                pass

    text = str(caught.value)
    assert "Child.reply overrides the signal handler Replying.reply without its decorator" in text
    assert "never be called" in text
    assert "declare it with @corral.signal as well" in text


def test_an_override_of_a_mailbox_signal_without_a_declaration_is_refused() -> None:
    with pytest.raises(corral.EntityDefinitionError,
                       match=r"declare it with corral\.signal\(Msg\) as well"):

        class Child(Replying):
            inbox = None


def test_an_override_that_changes_the_kind_of_a_handler_is_refused() -> None:
    with pytest.raises(corral.EntityDefinitionError) as caught:

        class Child(Replying):
            @corral.signal
            def ask(self, msg: Msg) -> None:
                pass

    assert ("Child.ask is a signal handler, but it overrides the update handler Replying.ask"
            in str(caught.value))


def test_a_handler_named_after_an_entity_member_is_refused() -> None:
    with pytest.raises(corral.EntityDefinitionError, match="cannot be named `checkpoint`"):

        class Bad(corral.Entity):
            @corral.signal
            def checkpoint(self, msg: Msg) -> None:  # type: ignore[override]
                pass


def test_every_problem_of_a_class_is_reported_at_once() -> None:
    with pytest.raises(corral.EntityDefinitionError) as caught:

        class Bad(Replying):
            id_reuse = "never"  # type: ignore[assignment]
            idle_timeout = -1

            def reply(self, msg: Msg) -> None:
                pass

            @corral.signal
            def poke(self, a: Msg, b: Msg) -> None:
                pass

            @corral.query
            async def peek(self) -> Answer:
                return Answer(value=1)

            def run(self) -> None:  # type: ignore[override]
                pass

    text = str(caught.value)
    assert text.startswith("Bad has 6 problems:")
    for problem in ("Bad.id_reuse must be an IdReusePolicy",
                    "Bad.idle_timeout must be a positive number",
                    "Bad.reply overrides the signal handler",
                    "signal handler `poke` of Bad must take one pydantic model",
                    "query handler `peek` must be a plain `def`",
                    "Bad.run must be `async def run(self)`"):
        assert f"\n  - {problem}" in text, problem
