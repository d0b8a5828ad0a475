"""The stored form of a payload never changes: its text is its payload hash, and a
retry that straddles an upgrade must hash as before (else it would be refused as an
idempotency conflict). Plain payloads are encoded through orjson, everything else
through the standard library's encoder; both must write exactly the text the standard
library writes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from corral import InvalidPayloadError
from corral.persistence import canonical_encoder, payload_hash, plain_canonical_json
from corral.runtime._payloads import encode_model

STDLIB = canonical_encoder().encode  # the reference: the stored form as first defined


class Holder(BaseModel):
    v: Any


def encode(value: Any) -> str:
    return encode_model(Holder, {"v": value}, max_bytes=2**30, what="payload")


def test_every_code_point_is_written_as_the_standard_library_writes_it() -> None:
    text = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    assert plain_canonical_json(text) == STDLIB(text)
    assert encode(text) == STDLIB({"v": text})


def test_object_keys_are_ordered_by_code_point_as_the_standard_library_orders_them() -> None:
    # UTF-16 order would put U+1F600 before U+E000; code point (and UTF-8) order after.
    keys = ["a", "B", "\u00e9", "\ue000", "\U0001f600", "\U0010ffff", "\x00", "\u2028", ""]
    value = {k * n: n for n in (1, 2) for k in keys}
    assert plain_canonical_json(value) == STDLIB(value)
    assert encode(value) == STDLIB({"v": value})


def test_the_stored_form_and_the_hash_of_a_mixed_payload_are_pinned() -> None:
    value = {"z": [1, -(2**63), 2**64 - 1, 1e-05, 1e-07, 1e16, 0.1, True, None],
             "a": {"\u00e9\n\x00\u2028\U0001f600": "\t\"\\/\x7f"}, "m": []}
    text = ('{"v":{"a":{"\u00e9\\n\\u0000\u2028\U0001f600":"\\t\\"\\\\/\x7f"},"m":[],'
            '"z":[1,-9223372036854775808,18446744073709551615,1e-05,1e-07,1e+16,0.1,'
            'true,null]}}')
    assert encode(value) == text
    assert payload_hash("ping", text).hex() == "6780d0a3bbc50419b3c1fdf09ada7559"
    assert encode([2**70, -(2**70)]) == '{"v":[1180591620717411303424,-1180591620717411303424]}'


json_values = st.recursive(
    st.none() | st.booleans() | st.text()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None, database=None)
@given(json_values)
def test_any_json_payload_is_stored_exactly_as_the_standard_library_writes_it(
        value: Any) -> None:
    assert encode(value) == STDLIB({"v": value})


@pytest.mark.parametrize("value", ["\ud800", {"k": ["ok", "a\udfffb"]}])
def test_a_lone_surrogate_is_refused_where_orjson_and_the_standard_library_differ(
        value: Any) -> None:
    assert plain_canonical_json(value) is None  # orjson refuses it...
    with pytest.raises(InvalidPayloadError, match="lone surrogate"):
        encode(value)  # ...and the boundary still names it
