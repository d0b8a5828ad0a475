"""Manifests and the compatibility rules between two builds of an entity type
(`actors/_manifest.py`, `actors/_compat.py`): one table row per rule."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, TypeAdapter

import corral
from build_entities import CaseR1, CaseR2
from corral.actors._compat import Difference, compare, incompatible, removed
from corral.actors._manifest import manifest, manifest_json


class Author(BaseModel):
    name: str


class AuthorWithEmail(BaseModel):
    name: str
    email: str  # required: a nested required field added


class AuthorWithNick(BaseModel):
    name: str
    nick: str = ""


class Reply(BaseModel):
    text: str
    author: Author


class ReplyOptional(BaseModel):
    text: str
    author: Author
    lang: str = "en"


class ReplyRequired(BaseModel):
    text: str
    author: Author
    lang: str


class ReplyNoAuthor(BaseModel):
    text: str


class ReplyStrict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str


class ReplyNestedRequired(BaseModel):
    text: str
    author: AuthorWithEmail


class ReplyNestedOptional(BaseModel):
    text: str
    author: AuthorWithNick


class ReplyIntText(BaseModel):
    text: int
    author: Author


class ReplyList(BaseModel):
    text: str
    authors: list[Author]


class ReplyListNested(BaseModel):
    text: str
    authors: list[AuthorWithEmail]


def _signal(model: type[BaseModel], name: str = "reply", *,
            renamed_from: str | None = None, kind: str = "signal") -> dict[str, Any]:
    return {name: {"kind": kind, "payload": model.model_json_schema(),
                   "renamed_from": [renamed_from] if renamed_from else []}}


def _m(handlers: dict[str, Any], *, version: int = 1, upgrades: tuple[int, ...] = (),
       waits: dict[str, Any] | None = None, state: dict[str, Any] | None = None,
       code: str | None = None) -> dict[str, Any]:
    """A manifest; without `state` and `code` one as an earlier corral stored it."""
    found = {"entity_type": "T", "fingerprint": "f", "state_version": version,
             "upgrades_from": list(upgrades), "handlers": handlers, "waits": waits or {}}
    if state is not None:
        found["state_fields"] = {name: TypeAdapter(t).json_schema() for name, t in state.items()}
    if code is not None:
        found["code"] = code
    return found


BASE = _m(_signal(Reply))
TAGS = _m(_signal(Reply), state={"tags": list[str], "inbox": list[Reply]}, code="c1")

RULES = [  # (case, older, newer, in_use, compatible, words of the incompatible explanation)
    ("same", BASE, BASE, {}, True, ""),
    ("handler added", BASE, _m({**_signal(Reply), **_signal(Reply, "close")}), {}, True, ""),
    ("declared rename", BASE, _m(_signal(Reply, "answer", renamed_from="reply")), {}, True,
     ""),
    ("optional field added", BASE, _m(_signal(ReplyOptional)), {}, True, ""),
    ("field removed", BASE, _m(_signal(ReplyNoAuthor)), {}, True, ""),
    ("nested optional field added", BASE, _m(_signal(ReplyNestedOptional)), {}, True, ""),
    ("higher state version with hooks", BASE, _m(_signal(Reply), version=3, upgrades=(1, 2)),
     {}, True, ""),
    ("handler removed, nothing uses it", BASE, _m({}), {}, True, ""),
    ("handler removed with entries", BASE, _m({}), {"reply": "2 journal entries"}, False,
     "signal reply: removed while 2 journal entries"),
    ("required field added", BASE, _m(_signal(ReplyRequired)), {}, False,
     "field lang: required field added"),
    ("nested required field added", BASE, _m(_signal(ReplyNestedRequired)), {}, False,
     "field author.email: required field added"),
    ("required field added in a list's model", _m(_signal(ReplyList)),
     _m(_signal(ReplyListNested)), {}, False, "field authors[].email: required field added"),
    ("a field's type changed", BASE, _m(_signal(ReplyIntText)), {}, False,
     "field text: type changed"),
    ("state version with no path", BASE, _m(_signal(Reply), version=3, upgrades=(1,)), {},
     False, "no upgrade hook from version 2"),
    ("state version lowered", _m(_signal(Reply), version=2, upgrades=(1,)), BASE, None, False,
     "snapshots written at 2"),
    ("kind changed", BASE, _m(_signal(Reply, kind="update")), {}, False, "became a update"),
    ("field removed from a model that forbids extras", _m(_signal(ReplyOptional)),
     _m(_signal(ReplyStrict)), {}, False, "forbids extra fields"),
    ("code changed", TAGS, {**TAGS, "code": "c2"}, {}, True, ""),
    ("state fields added and removed", TAGS,
     _m(_signal(Reply), state={"inbox": list[Reply], "seen": int}), {}, True, ""),
    ("optional field added to a state model", TAGS,
     _m(_signal(Reply), state={"tags": list[str], "inbox": list[ReplyOptional]}), {}, True,
     ""),
    ("state field's type changed", TAGS,
     _m(_signal(Reply), state={"tags": int, "inbox": list[Reply]}), {}, False,
     "state field tags: type changed from list[str] to int"),
    ("required field added to a state model", TAGS,
     _m(_signal(Reply), state={"tags": list[str], "inbox": list[ReplyRequired]}), {}, False,
     "state field inbox: type changed from list[Reply] to list[ReplyRequired] (field "
     "[].lang: required field added"),
    ("state field's type changed with an upgrade hook", TAGS,
     _m(_signal(Reply), version=2, upgrades=(1,), state={"tags": int, "inbox": list[Reply]}),
     {}, True, ""),
    ("state field's type changed, version raised without a hook", TAGS,
     _m(_signal(Reply), version=2, state={"tags": int, "inbox": list[Reply]}), {}, False,
     "state field tags: type changed from list[str] to int"),
    ("older manifest without state fields or code", BASE,
     _m(_signal(Reply), state={"tags": int}, code="c2"), {}, True, ""),
]


@pytest.mark.parametrize(("case", "older", "newer", "in_use", "ok", "words"), RULES,
                         ids=[r[0] for r in RULES])
def test_each_rule_classes_a_difference_with_its_explanation_and_fix(
        case: str, older: dict[str, Any], newer: dict[str, Any],
        in_use: dict[str, str] | None, ok: bool, words: str) -> None:
    found = compare(older, newer, in_use=in_use)
    bad = incompatible(found)
    assert (not bad) is ok, found
    if not ok:
        assert any(words in str(d) for d in bad), [str(d) for d in bad]
        assert all(d.fix for d in bad)
    assert all(isinstance(d, Difference) and d.explanation for d in found)


def test_removed_names_the_handlers_a_newer_build_neither_has_nor_renamed() -> None:
    older = _m({**_signal(Reply), **_signal(Reply, "close"), **_signal(Reply, "old")})
    newer = _m(_signal(Reply, "new", renamed_from="old"))
    assert removed(older, newer) == ["reply", "close"]


def test_a_manifest_is_canonical_json_of_the_definition() -> None:
    text = manifest_json(CaseR2._corral_definition)  # type: ignore[attr-defined]
    assert text == manifest_json(CaseR2._corral_definition)  # type: ignore[attr-defined]
    data = json.loads(text)
    assert data == manifest(CaseR2._corral_definition)  # type: ignore[attr-defined]
    assert data["state_version"] == 2
    assert data["upgrades_from"] == [1]
    assert data["handlers"]["remark"]["renamed_from"] == ["note"]
    assert data["handlers"]["view"] == {"kind": "query", "payload": None, "renamed_from": []}
    assert data["fingerprint"] == CaseR2._corral_definition.fingerprint  # type: ignore[attr-defined]


def test_release_2_is_compatible_with_release_1_and_not_the_other_way_round() -> None:
    r1 = manifest(CaseR1._corral_definition)  # type: ignore[attr-defined]
    r2 = manifest(CaseR2._corral_definition)  # type: ignore[attr-defined]
    assert incompatible(compare(r1, r2)) == []
    subjects = {d.subject for d in compare(r1, r2)}
    assert {"signal note", "signal escalate", "state_version"} <= subjects
    backwards = incompatible(compare(r2, r1, in_use={"escalate": "1 journal entry"}))
    assert {d.subject for d in backwards} == {"signal escalate", "state_version"}


def test_a_state_field_whose_type_changed_names_both_types_and_the_fix() -> None:
    newer = _m(_signal(Reply), state={"tags": int, "inbox": list[Reply]})
    [found] = compare(TAGS, newer)
    assert str(found) == (
        "state field tags: type changed from list[str] to int: snapshots of the older build "
        "would not restore; fix: bump state_version to 2 and add an upgrade hook from 1 "
        "(@corral.upgrade(from_version=1)) that converts tags")
    hooked = compare(TAGS, {**newer, "state_version": 2, "upgrades_from": [1]})
    assert [(d.subject, d.compatible) for d in hooked] == [("state field tags", True),
                                                            ("state_version", True)]


def test_a_code_only_change_is_reported_and_compatible() -> None:
    found = compare(TAGS, {**TAGS, "code": "c2"})
    assert [(str(d), d.compatible) for d in found] == [
        ("code: c1 -> c2 (new code, the same interface)", True)]
    assert incompatible(found) == []


class Tagged(corral.Entity):
    tags: list[str]
    inbox: list[Reply]

    def __init__(self) -> None:
        self.tags, self.inbox = [], []


def test_a_manifest_holds_the_code_and_each_state_field_as_its_json_schema() -> None:
    d = Tagged._corral_definition  # type: ignore[attr-defined]
    data = manifest(d)
    assert data["code"] == d.code
    assert data["state_fields"] == {"inbox": TypeAdapter(list[Reply]).json_schema(),
                                    "tags": {"items": {"type": "string"}, "type": "array"}}
    assert data["fingerprint"] == d.fingerprint
