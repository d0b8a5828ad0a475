"""The problems found in one entity class, collected while it is defined.

A leaf of `corral.actors`: `_definition` (handlers, waits, policies) and `_state` (the
state's annotations and upgrade hooks) both add to one `DefinitionIssues`, which
`define_entity` raises as one `EntityDefinitionError`.
"""

from __future__ import annotations

from corral._errors import EntityDefinitionError

__all__ = ["DefinitionIssues"]


class DefinitionIssues:
    """The problems found in one class, reported together (as temporalio's definition
    check does), so a user fixes them in one pass rather than one per import."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.found: list[str] = []

    def add(self, problem: str) -> None:
        if problem not in self.found:
            self.found.append(problem)

    def raise_if_any(self) -> None:
        if len(self.found) == 1:
            raise EntityDefinitionError(self.found[0])
        if self.found:
            listed = "".join(f"\n  - {p}" for p in self.found)
            raise EntityDefinitionError(
                f"{self.cls.__name__} has {len(self.found)} problems:{listed}")
