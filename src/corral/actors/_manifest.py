"""The manifest of an entity type: what its code promises to callers and to the store.

A manifest is derived from an `EntityDefinition`, purely and deterministically, as plain
JSON: the fingerprint, the hash of its code (`EntityDefinition.code`), `state_version`
and the versions its upgrade hooks start from, each annotated state attribute's type
(`state_fields`: its JSON schema), each handler (kind, payload JSON schema,
`renamed_from`) and each wait (payload schema, `renamed_from`). The store keeps one per
build (`corral builds`); `_compat` compares two. Manifests stored by an earlier corral
lack `code` and `state_fields`.

Example:
    manifest_json(Ticket._corral_definition)
    # '{"entity_type":"Ticket","fingerprint":"...","handlers":{"reply":{...}},...}'
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from ._definition import EntityDefinition
from ._state import StateSchema

__all__ = ["Manifest", "manifest", "manifest_json", "payload_schema", "state_fields"]

Manifest = dict[str, Any]
"""A manifest as JSON data (see the module docstring for its keys)."""


def payload_schema(model: type[BaseModel] | None) -> dict[str, Any] | None:
    """The JSON schema of a payload model; None for a handler that takes none, and
    `{"opaque": name}` for a model pydantic cannot describe."""
    if model is None:
        return None
    try:
        return model.model_json_schema()
    except Exception:  # a field type without a JSON schema
        return {"opaque": model.__qualname__}


def state_fields(state: StateSchema) -> dict[str, Any]:
    """Each annotated state attribute's type as its JSON schema (what a snapshot of it is
    validated against on restore), `{"opaque": repr}` for one pydantic cannot describe;
    none for a class whose `__getstate__` says what its state is."""
    if state.custom:
        return {}
    described: dict[str, Any] = {}
    for name, adapter in sorted(state.fields.items()):
        try:
            described[name] = adapter.json_schema()
        except Exception:  # a type without a JSON schema
            described[name] = {"opaque": repr(state.types.get(name))}
    return described


def manifest(definition: EntityDefinition) -> Manifest:
    """The manifest of `definition` (plain JSON data, the same on every run)."""
    return {
        "entity_type": definition.name,
        "fingerprint": definition.fingerprint,
        "code": definition.code,
        "state_version": definition.state.version,
        "upgrades_from": sorted(definition.state.upgrades),
        "state_fields": state_fields(definition.state),
        "handlers": {
            h.name: {"kind": h.kind.value, "payload": payload_schema(h.input_type),
                     "renamed_from": list(h.renamed_from)}
            for h in sorted(definition.handlers.values(), key=lambda h: h.name)},
        "waits": {
            w.name: {"payload": payload_schema(w.model), "renamed_from": list(w.renamed_from)}
            for w in sorted(definition.waits.values(), key=lambda w: w.name)},
    }


def manifest_json(definition: EntityDefinition) -> str:
    """The manifest as canonical JSON text (sorted keys, no spaces): equal definitions
    give equal text."""
    return json.dumps(manifest(definition), sort_keys=True, separators=(",", ":"))
