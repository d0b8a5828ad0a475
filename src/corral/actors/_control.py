"""Control flow an entity raises to its host (never an error a caller sees)."""

from __future__ import annotations

__all__ = ["ContinueAsNew"]


class ContinueAsNew(BaseException):
    """Raised by `Entity.continue_as_new`; the host closes the run and starts the next.

    A `BaseException`, so `except Exception` in user code cannot swallow it.
    """

    def __init__(self, next_input: object) -> None:
        super().__init__("continue-as-new")
        self.next_input = next_input
