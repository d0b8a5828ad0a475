"""Validating a caller's payload against its model and encoding it canonically.

The boundary and continue-as-new encode through `encode_model`; the stored form
(`canonical_json`, `payload_hash`) belongs to the store.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from corral._errors import InvalidPayloadError, PayloadTooLargeError
from corral.actors import EntityDefinition
from corral.persistence import canonical_encoder, canonical_json, plain_canonical_json

__all__ = ["decode_model", "encode_model", "encode_start"]

M = TypeVar("M", bound=BaseModel)


def decode_model(model_type: type[M], text: str) -> M:
    """Parse stored canonical JSON into `model_type` (pydantic's validator itself:
    `model_validate_json` costs ~1.3 us more a call, and every applied entry calls it).

    Raises pydantic's `ValidationError` if the text no longer fits the model."""
    model: M = model_type.__pydantic_validator__.validate_json(text)
    return model


def encode_model(model_type: type[BaseModel], value: Any, *, max_bytes: int, what: str) -> str:
    """Validate `value` against `model_type` and return its canonical JSON.

    Accepts an instance of exactly `model_type` or a JSON-like mapping. Both are
    validated here: an instance may have been changed after it was built (pydantic
    does not validate assignment by default) or built unvalidated with
    `model_construct`, so it is dumped and validated again like a dict. Unknown
    fields are refused rather than dropped, and NaN or infinities rather than turned
    into null; strings must be valid Unicode (no lone surrogates): a sender's data
    never silently disappears or changes.

    Raises:
        InvalidPayloadError: wrong type, failed validation, unknown fields, not JSON,
            not valid Unicode, nested too deeply.
        PayloadTooLargeError: the canonical JSON exceeds `max_bytes`.
    """
    try:
        return _encode(model_type, value, max_bytes, what)
    except RecursionError:
        raise InvalidPayloadError(f"{what} is nested too deeply") from None


def _encode(model_type: type[BaseModel], value: Any, max_bytes: int, what: str) -> str:
    # `type(value) is model_type` first: isinstance against BaseModel goes through its
    # ABC metaclass's Python-level __instancecheck__ (~0.5 us on every send).
    if type(value) is model_type:
        raw, from_instance = _dump(value, what), True
    elif isinstance(value, BaseModel):
        raise InvalidPayloadError(
            f"{what} expects {model_type.__name__}, got {type(value).__name__}"
        )
    elif isinstance(value, dict):
        raw, from_instance = _plain(value, what), False
    else:
        raise InvalidPayloadError(
            f"{what} expects {model_type.__name__} (or a dict of its fields), "
            f"got {type(value).__name__}"
        )
    # pydantic's validator and serializer are called directly: `model_validate` and
    # `model_dump` only pass them their keyword defaults, which costs ~1-2 us a call (on
    # every send, this was half of encoding a small payload).
    try:
        model = model_type.__pydantic_validator__.validate_python(raw)
    except ValidationError as err:
        unknown = [] if from_instance else _unknown_keys(model_type, raw)
        also = f"unknown field(s) {', '.join(map(repr, unknown))}; " if unknown else ""
        raise InvalidPayloadError(f"{what}: {also}{err}") from None
    try:
        # Python mode keeps NaN and infinities as floats, so the encoder refuses them
        # (JSON mode would have turned them into null); other values go through
        # pydantic's JSON conversion.
        data = model.__pydantic_serializer__.to_python(model, by_alias=True)
        text = plain_canonical_json(data) if _checked_plain(data, what) else None
        if text is None:  # not plain, or refused by orjson: the standard library's encoder
            text = _PAYLOAD_JSON.encode(data)
    except (TypeError, ValueError, PydanticSerializationError) as err:
        raise InvalidPayloadError(f"{what} is not JSON: {err}") from None
    if not from_instance and not _same(raw, data):  # equal data has no unknown field
        _refuse_unknown_fields(raw, data, what, path="")
    try:
        size = len(text.encode())
    except UnicodeEncodeError as err:
        raise InvalidPayloadError(
            f"{what} is not valid Unicode: a lone surrogate {text[err.start:err.end]!r} "
            f"at character {err.start} of its JSON"
        ) from None
    if size > max_bytes:
        raise PayloadTooLargeError(f"{what} is {size} bytes; the limit is {max_bytes}")
    return text


def _dump(model: BaseModel, what: str) -> Any:
    """An instance's fields as plain data, to validate again: it may have been changed
    after it was built, or built with `model_construct` (round_trip leaves out computed
    fields, which are not input)."""
    try:
        return model.__pydantic_serializer__.to_python(model, by_alias=True, round_trip=True,
                                                       warnings=False)
    except (ValueError, TypeError, AttributeError, PydanticSerializationError) as err:
        raise InvalidPayloadError(f"{what}: the instance cannot be read: {err}") from None


def _plain(value: Any, what: str) -> Any:
    """`value` with every model instance inside it dumped (pydantic would take a nested
    instance as it is, unvalidated); containers without one are returned as they are."""
    if isinstance(value, BaseModel):
        return _dump(value, what)
    if isinstance(value, dict):
        changed = {k: p for k, v in value.items() if (p := _plain(v, what)) is not v}
        return {**value, **changed} if changed else value
    if isinstance(value, list | tuple):
        items = [_plain(v, what) for v in value]
        if any(p is not v for p, v in zip(items, value, strict=True)):
            return items if isinstance(value, list) else tuple(items)
    return value


def _unknown_keys(model_type: type[BaseModel], raw: dict[Any, Any]) -> list[Any]:
    """Top-level keys of `raw` that name no field of `model_type` (a misspelt field
    shows up as "missing" in pydantic's error; this names the misspelling too)."""
    if model_type.model_config.get("extra") == "allow":
        return []
    known: set[Any] = set()
    for name, field in model_type.model_fields.items():
        known |= {name, field.alias, field.validation_alias}
    return [k for k in raw if k not in known]


MAX_DEPTH = 100
"""Deepest nesting of objects and arrays a payload may have. The host parses stored
payloads with pydantic's JSON parser, which stops at about 200 levels: a payload it
could not read back must be refused here, not fail when it is applied."""


_PLAIN_LEAVES = frozenset({str, int, bool, type(None)})


def _checked_plain(data: Any, what: str) -> bool:
    """Refuse non-string object keys (json.dumps would silently turn 1 into "1") and
    nesting beyond `MAX_DEPTH`; return whether `data` is plain JSON for
    `plain_canonical_json` (only exact dicts, lists, str, int, bool and None)."""
    plain = True
    stack = [(data, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidPayloadError(f"{what} is nested more than {MAX_DEPTH} levels deep")
        if type(item) is dict:
            for k, v in item.items():
                if type(k) is not str:
                    raise InvalidPayloadError(f"{what} is not JSON: key {k!r} is not a string")
                if type(v) is dict or type(v) is list:
                    stack.append((v, depth + 1))
                elif plain and type(v) not in _PLAIN_LEAVES:
                    plain = False
        elif type(item) is list:
            for v in item:
                if type(v) is dict or type(v) is list:
                    stack.append((v, depth + 1))
                elif plain and type(v) not in _PLAIN_LEAVES:
                    plain = False
        elif type(item) not in _PLAIN_LEAVES:
            plain = False
    return plain


def _jsonable(value: Any) -> Any:
    if isinstance(value, set | frozenset):  # unordered: sort for a stable payload hash
        return sorted(to_jsonable_python(list(value)), key=canonical_json)
    return to_jsonable_python(value)


_PAYLOAD_JSON = canonical_encoder(default=_jsonable)


def _same(raw: Any, data: Any) -> bool:
    try:
        return bool(raw == data)
    except Exception:  # a caller's object whose == is not a plain bool
        return False


def _refuse_unknown_fields(raw: Any, data: Any, what: str, path: str) -> None:
    if isinstance(raw, dict) and isinstance(data, dict):
        for field, value in raw.items():
            if field not in data:
                raise InvalidPayloadError(f"{what}: unknown field {path}{field!s}")
            _refuse_unknown_fields(value, data[field], what, f"{path}{field}.")
    elif isinstance(raw, list | tuple) and isinstance(data, list) and len(raw) == len(data):
        for i, (r, d) in enumerate(zip(raw, data, strict=True)):
            _refuse_unknown_fields(r, d, what, f"{path}{i}.")


def encode_start(definition: EntityDefinition, value: object, *,
                 max_bytes: int = 2**62) -> str:
    """Canonical JSON of a start input. The boundary passes its payload limit; the
    runtime itself (continue-as-new) is a trusted sender and passes none."""
    if definition.start_type is None:
        if value is not None:
            raise InvalidPayloadError(f"{definition.name}.__init__ takes no start input")
        return "null"
    return encode_model(definition.start_type, value, max_bytes=max_bytes,
                        what=f"{definition.name} start input")
