"""Whether a newer build of an entity type may run beside an older one: decided once.

`compare(older, newer)` walks two manifests (`_manifest`) and returns every
`Difference`, each classed compatible or not with a one-line explanation and the fix.
The rules (DESIGN guarantee 15):

* compatible: a handler or wait added; one renamed with `renamed_from=`; an optional
  payload field added; a field removed; a higher `state_version` whose upgrade hooks
  reach it from the older one; a handler removed that nothing uses any more;
* incompatible: a handler or wait removed while entries or senders of it remain (the
  caller passes those facts in as `in_use`); a required payload field added (or one
  made required); a field's type changed; a handler's kind changed; a `state_version`
  with no path (a missing upgrade hook, or a lower version than the older build's);
  an annotated state attribute whose type changed (snapshots of the older build would
  not restore), unless the newer build raises `state_version` with an upgrade hook
  from the older one's.

State attributes added or removed stay compatible (a restore validates against
today's annotations); so does a changed `code` (a body-only change: a new build of the
same interface, reported for information). Payload schemas and state attributes' types
are compared field by field, through nested models (`$ref`s), lists and unions of the
same shape; anything else that differs is a type change. A manifest stored by an
earlier corral, without `code` or `state_fields`, is compared without them.
Pure: no store, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._manifest import Manifest

__all__ = ["Difference", "compare", "incompatible", "removed"]

_SECTIONS = (("handlers", "handler"), ("waits", "wait"))
_NOT_SHAPE = frozenset({"title", "description", "default", "examples"})


@dataclass(frozen=True, slots=True)
class Difference:
    """One way a newer build differs from an older one."""

    subject: str
    """What differs: `signal reply`, `signal reply: field author.name`, `state_version`."""
    compatible: bool
    explanation: str
    fix: str = ""
    """What to change to make an incompatible difference go away ("" when compatible)."""

    def __str__(self) -> str:
        text = f"{self.subject}: {self.explanation}"
        return f"{text}; fix: {self.fix}" if self.fix else text


def incompatible(differences: Sequence[Difference]) -> list[Difference]:
    return [d for d in differences if not d.compatible]


def removed(older: Manifest, newer: Manifest) -> list[str]:
    """Names of the older build's handlers and waits the newer one neither has nor
    declares as renamed: the names whose use (`in_use`) decides `compare`."""
    gone = []
    for section, _ in _SECTIONS:
        for name in older[section]:
            if _successor(newer[section], name) is None:
                gone.append(name)
    return gone


def compare(older: Manifest, newer: Manifest, *,
            in_use: Mapping[str, str] | None = None) -> list[Difference]:
    """Every difference of `newer` from `older` (manifests of one entity type).

    Args:
        in_use: for a removed handler or wait name, why it is still in use ("3 journal
            entries", "process 41-ab12 of build 9f3c sends it"); a removal not named here
            is compatible.
    """
    uses = in_use or {}
    found: list[Difference] = []
    for section, noun in _SECTIONS:
        old_items, new_items = older[section], newer[section]
        for name, old in old_items.items():
            found += _evolved(noun, name, old, new_items, uses)
        for name, new in new_items.items():
            if name not in old_items and not set(new["renamed_from"]) & set(old_items):
                found.append(Difference(f"{new.get('kind', noun)} {name}", True, "added"))
    found += _state_fields(older, newer)
    found += _state(older, newer)
    was_code, now_code = older.get("code"), newer.get("code")
    if was_code and now_code and was_code != now_code:  # one stored by an earlier corral
        found.append(Difference("code", True, f"{was_code} -> {now_code} (new code, the "
                                "same interface)"))
    return found


def _successor(items: Mapping[str, Any], name: str) -> str | None:
    """The newer build's name for `name`: itself, or the one declaring it renamed."""
    if name in items:
        return name
    return next((n for n, item in items.items() if name in item["renamed_from"]), None)


def _evolved(noun: str, name: str, old: Mapping[str, Any], new_items: Mapping[str, Any],
             uses: Mapping[str, str]) -> list[Difference]:
    kind = old.get("kind", noun)
    subject = f"{kind} {name}"
    successor = _successor(new_items, name)
    if successor is None:
        why = uses.get(name)
        if why is None:
            return [Difference(subject, True, "removed; nothing uses it any more")]
        return [Difference(subject, False, f"removed while {why}",
                           f"keep {kind} {name} (or declare renamed_from={name!r} on its "
                           "successor) until nothing uses it")]
    new = new_items[successor]
    found = []
    if successor != name:
        found.append(Difference(subject, True, f"renamed to {successor} (renamed_from)"))
    if new.get("kind", noun) != kind:
        return [*found, Difference(subject, False, f"became a {new['kind']}",
                                   f"keep {name} a {kind}; add the {new['kind']} under a "
                                   "new name")]
    return found + _payload(subject, old["payload"], new["payload"])


def _payload(subject: str, old: Any, new: Any) -> list[Difference]:
    if new is None:
        return [] if old is None else [Difference(subject, True, "takes no payload now")]
    if old is None:
        return [Difference(subject, False, "takes a payload now (stored entries have none)",
                           "add the payload under a new handler name")]
    return _fields(subject, "", _Schema(old), old, _Schema(new), new)


class _Schema:
    """A payload schema's `$defs`, to follow `$ref`s into nested models."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.defs: Mapping[str, Any] = root.get("$defs", {})

    def resolve(self, node: Any) -> Any:
        ref = node.get("$ref") if isinstance(node, Mapping) else None
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return self.defs.get(ref.removeprefix("#/$defs/"), {})
        return node

    def shape(self, node: Any, seen: frozenset[str] = frozenset()) -> Any:
        """`node` with refs followed and titles, descriptions and defaults left out."""
        if isinstance(node, Mapping):
            ref = node.get("$ref")
            if isinstance(ref, str):
                return ref if ref in seen else self.shape(self.resolve(node), seen | {ref})
            return {k: self.shape(v, seen) for k, v in node.items()
                    if k not in _NOT_SHAPE and k != "$defs"}
        if isinstance(node, list):
            return [self.shape(v, seen) for v in node]
        return node


def _fields(subject: str, path: str, olds: _Schema, old: Any, news: _Schema, new: Any
            ) -> list[Difference]:
    old, new = olds.resolve(old), news.resolve(new)
    where = f"{subject}: field {path}" if path else subject
    if not (isinstance(old, Mapping) and isinstance(new, Mapping)):
        return [] if old == new else [Difference(where, False, "type changed",
                                                 "keep the field's type")]
    if _is_object(old) and _is_object(new):
        return _objects(subject, path, olds, old, news, new)
    for key in ("anyOf", "oneOf"):
        if isinstance(old.get(key), list) and isinstance(new.get(key), list) \
                and len(old[key]) == len(new[key]):
            return [d for o, n in zip(old[key], new[key], strict=True)
                    for d in _fields(subject, path, olds, o, news, n)]
    if old.get("type") == new.get("type") == "array" and "items" in old and "items" in new:
        return _fields(subject, f"{path}[]" if path else "[]", olds, old["items"],
                       news, new["items"])
    if olds.shape(old) != news.shape(new):
        return [Difference(where, False, f"type changed from {_named(old)} to "
                           f"{_named(new)}",
                           "keep the field's type; add a new field for the new type")]
    return []


def _is_object(node: Any) -> bool:
    return isinstance(node, Mapping) and "properties" in node


def _objects(subject: str, path: str, olds: _Schema, old: Mapping[str, Any], news: _Schema,
             new: Mapping[str, Any]) -> list[Difference]:
    found: list[Difference] = []
    old_props, new_props = old["properties"], new["properties"]
    old_required, new_required = set(old.get("required", ())), set(new.get("required", ()))
    for field, spec in new_props.items():
        name = f"{path}.{field}" if path else field
        where = f"{subject}: field {name}"
        if field not in old_props:
            if field in new_required:
                found.append(Difference(where, False, "required field added (stored and "
                                        "older senders' payloads lack it)",
                                        f"give {name} a default (make it optional)"))
            else:
                found.append(Difference(where, True, "optional field added"))
            continue
        if field in new_required and field not in old_required:
            found.append(Difference(where, False, "became required",
                                    f"keep {name} optional (a default)"))
        found += _fields(subject, name, olds, old_props[field], news, spec)
    for field in old_props:
        if field not in new_props:
            name = f"{path}.{field}" if path else field
            forbids = new.get("additionalProperties") is False
            found.append(Difference(
                f"{subject}: field {name}", not forbids,
                "removed, but the model forbids extra fields" if forbids else "removed",
                "allow extra fields (extra='ignore') or keep the field" if forbids else ""))
    return found


_SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool",
            "null": "None"}


def _named(node: Any) -> str:
    """A schema node as a Python type, in brief: `list[str]`, `int | None`, `Reply`."""
    return _brief(_python(node))


def _python(node: Any) -> str:
    if not isinstance(node, Mapping):
        return str(node)
    ref, kind = node.get("$ref"), node.get("type")
    rest = {k: v for k, v in node.items() if k not in _NOT_SHAPE and k != "$defs"}
    if isinstance(ref, str):
        return ref.rpartition("/")[2]  # a model, by its name
    if "properties" in node and isinstance(node.get("title"), str):
        return str(node["title"])
    if not rest:
        return "Any"
    if isinstance(node.get("opaque"), str):
        return str(node["opaque"])
    if isinstance(node.get("anyOf"), list):
        return " | ".join(_python(option) for option in node["anyOf"])
    if kind == "array" and set(rest) <= {"type", "items"}:
        return f"list[{_python(node.get('items', {}))}]"
    if kind == "object" and set(rest) <= {"type", "additionalProperties"}:
        return f"dict[str, {_python(node.get('additionalProperties', {}))}]"
    if kind in _SCALARS and len(rest) == 1:
        return _SCALARS[kind]
    return str(rest)


def _brief(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _state_fields(older: Manifest, newer: Manifest) -> list[Difference]:
    """The annotated state attributes of both builds whose type changed: compatible only
    when the newer build raised `state_version` with an upgrade hook from the older's."""
    olds, news = older.get("state_fields"), newer.get("state_fields")
    if olds is None or news is None:  # a manifest stored by an earlier corral
        return []
    was, now = older["state_version"], newer["state_version"]
    upgraded = now > was and was in newer["upgrades_from"]
    found: list[Difference] = []
    for name in sorted(set(olds) & set(news)):
        old, new = olds[name], news[name]
        subject = f"state field {name}"
        changes = incompatible(_fields(subject, "", _Schema(old), old, _Schema(new), new))
        if not changes:
            continue
        was_type, now_type = _named(old), _named(new)
        what = (f"type changed from {was_type} to {now_type}" if was_type != now_type
                else f"{now_type} changed")
        inside = [f"{d.subject.removeprefix(subject + ': ')}: {d.explanation}"
                  for d in changes if d.subject != subject]
        if inside:
            what += f" ({'; '.join(inside)})"
        if upgraded:
            found.append(Difference(subject, True, f"{what}; the upgrade hook from version "
                                    f"{was} converts it"))
        else:
            found.append(Difference(
                subject, False, f"{what}: snapshots of the older build would not restore",
                f"bump state_version to {was + 1} and add an upgrade hook from {was} "
                f"(@corral.upgrade(from_version={was})) that converts {name}"))
    return found


def _state(older: Manifest, newer: Manifest) -> list[Difference]:
    was, now = older["state_version"], newer["state_version"]
    if now == was:
        return []
    if now < was:
        return [Difference("state_version", False,
                           f"{now} is below {was}: snapshots written at {was} cannot be read",
                           f"keep state_version >= {was}")]
    missing = [v for v in range(was, now) if v not in newer["upgrades_from"]]
    if missing:
        return [Difference("state_version", False,
                           f"{was} -> {now} has no upgrade hook from version {missing[0]}",
                           f"add @corral.upgrade(from_version={missing[0]})")]
    return [Difference("state_version", True, f"{was} -> {now}, upgrade hooks reach it")]
