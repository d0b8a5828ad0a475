"""The stored form of payloads: canonical JSON (never pickle for anything a caller
sends) and the hash that says whether two messages are the same; and the stored form
of text that user code makes (`storable_text`)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

import orjson

__all__ = [
    "canonical_encoder",
    "canonical_json",
    "closing_texts",
    "payload_hash",
    "plain_canonical_json",
    "storable_text",
]

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def canonical_encoder(default: Callable[[Any], Any] | None = None) -> json.JSONEncoder:
    """The encoder of the stored form: compact, key-sorted JSON; NaN and infinities are
    refused (they are not JSON). Built once and reused: `json.dumps` with these options
    builds a new encoder per call, a third of its cost for a small payload."""
    return json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False,
                            ensure_ascii=False, default=default)


canonical_json: Callable[[Any], str] = canonical_encoder().encode
"""`value` in the stored form (see `canonical_encoder`)."""


def plain_canonical_json(value: Any) -> str | None:
    """`canonical_json(value)` for plain JSON data, through orjson (~9x faster).

    Plain means exact dicts with str keys, lists, str, int, bool and None: no floats
    (orjson writes `1e-5` where the stored form has `1e-05`, and a changed stored form
    would change the payload hash across an upgrade) and nothing a `default` converts.
    On that data both encoders write the same text (a test pins it for every code point
    and for key order). None where orjson refuses (an int beyond 64 bits, a lone
    surrogate): the caller then encodes through `canonical_encoder`.
    """
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return None


def payload_hash(name: str, payload: str) -> bytes:
    """What "the same message" means for deduplication: the same handler and payload."""
    return hashlib.blake2b(f"{name}\0{payload}".encode(), digest_size=16).digest()


def storable_text(text: str) -> str:
    """`text` as both stores can keep it, and keep alike: each NUL (PostgreSQL refuses
    it) becomes its escape `\\u0000`, and each lone surrogate (not UTF-8: neither
    engine can encode it) the replacement character U+FFFD, as `errors="replace"`
    decoding would have made it.

    For the text user code makes and corral writes as it is: an exception's message
    and traceback (dead letters, failed runs), a run's result. In JSON text (a result)
    a NUL is always escaped already and a lone surrogate can only sit in a string, so
    the JSON stays valid, and pydantic reads it back (it refuses a lone surrogate's
    escape).

    Example:
        >>> storable_text("bad\\x00input")
        'bad\\\\u0000input'
        >>> storable_text("\\udcff") == "\\ufffd"
        True
    """
    if _UNSTORABLE.search(text) is None:  # nearly always: one scan, no copy
        return text
    return _UNSTORABLE.sub(_storable, text)


def _storable(found: re.Match[str]) -> str:
    return "\\u0000" if found.group() == "\x00" else "\ufffd"


def closing_texts(result: str | None, error: str | None) -> tuple[str | None, str | None]:
    """A closing run's result (JSON) and error text, each as `storable_text`."""
    return (None if result is None else storable_text(result),
            None if error is None else storable_text(error))
