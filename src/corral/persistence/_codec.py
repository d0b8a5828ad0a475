"""Canonical JSON for payloads (never pickle for anything a caller sends)."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from pydantic import BaseModel, ValidationError

from corral.actors import InvalidPayloadError, PayloadTooLargeError

__all__ = ["canonical_json", "encode_model", "payload_hash"]


def canonical_json(value: Any) -> str:
    """Compact, key-sorted JSON; NaN and infinities are refused (they are not JSON)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False,
                      ensure_ascii=False)


def payload_hash(name: str, payload: str) -> bytes:
    """What "the same message" means for deduplication: the same handler and payload."""
    return hashlib.blake2b(f"{name}\0{payload}".encode(), digest_size=16).digest()


def encode_model(model_type: type[BaseModel], value: Any, *, max_bytes: int, what: str) -> str:
    """Validate `value` against `model_type` and return its canonical JSON.

    Accepts an instance of exactly `model_type` or a JSON-like mapping. Unknown fields
    are refused rather than dropped: a sender's data never silently disappears.

    Raises:
        InvalidPayloadError: wrong type, failed validation, unknown fields, not JSON.
        PayloadTooLargeError: the canonical JSON exceeds `max_bytes`.
    """
    if isinstance(value, BaseModel):
        if type(value) is not model_type:
            raise InvalidPayloadError(
                f"{what} expects {model_type.__name__}, got {type(value).__name__}"
            )
        _refuse_non_finite(value, what)
        raw: Any = _dump(value, what)
    elif isinstance(value, dict):
        raw = value
    else:
        raise InvalidPayloadError(
            f"{what} expects {model_type.__name__} (or a dict of its fields), "
            f"got {type(value).__name__}"
        )
    try:
        model = model_type.model_validate(raw)
    except ValidationError as err:
        raise InvalidPayloadError(f"{what}: {err}") from None
    if not isinstance(value, BaseModel):
        _refuse_non_finite(model, what)
    data = _dump(model, what)
    if not _same(raw, data):  # equal data has no unknown field: skip the (slower) walk
        _refuse_unknown_fields(raw, data, what, path="")
    try:
        text = canonical_json(data)
    except (TypeError, ValueError) as err:
        raise InvalidPayloadError(f"{what} is not JSON: {err}") from None
    size = len(text.encode())
    if size > max_bytes:
        raise PayloadTooLargeError(f"{what} is {size} bytes; the limit is {max_bytes}")
    return text


def _dump(model: BaseModel, what: str) -> Any:
    try:
        return model.model_dump(mode="json", by_alias=True)
    except Exception as err:  # pydantic raises several types for unserialisable values
        raise InvalidPayloadError(f"{what} is not JSON-serialisable: {err}") from None


def _refuse_non_finite(model: BaseModel, what: str) -> None:
    """Refuse NaN and infinities anywhere in `model`.

    pydantic's JSON mode turns them into null in `Any`-typed fields (it keeps them in
    `float` fields, which `canonical_json` then refuses): either way they are not JSON,
    and a sender's value must never silently become another one.
    """
    try:
        values = [model.model_dump(mode="python")]
    except Exception as err:  # pydantic raises several types for unserialisable values
        raise InvalidPayloadError(f"{what} is not JSON-serialisable: {err}") from None
    while values:
        item = values.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise InvalidPayloadError(f"{what} is not JSON: {item!r} is not a JSON number")
        if isinstance(item, dict):
            values.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            values.extend(item)


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
