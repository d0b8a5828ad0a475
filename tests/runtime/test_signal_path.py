"""The map of a signal's path in `corral.runtime`'s docstring is the path a call takes.

The docstring lists each path as numbered lines, one step each (a function, named
relative to `corral.runtime` or absolutely from `corral.`). The test resolves every step to its
function, so a renamed or moved one fails here, then traces one `signal_with_start` of
each local path with `sys.setprofile`, noting the first entry into each named function,
and checks that the steps were entered in the order the docstring gives.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

from pydantic import BaseModel

import corral
import corral.runtime

RUNNING = "Local backend, one process, to a running entity:"
STARTING = "Local backend, one process, to an entity it starts (the run this call opens):"
RAY = "Ray backend, client process -> host actor (not traced; the names are checked):"
_STEP = re.compile(r"^\d+\. `([\w.]+)`")


def steps(title: str) -> list[str]:
    """The numbered steps of the docstring's list under `title`, in order."""
    doc = corral.runtime.__doc__ or ""
    assert title in doc, f"the runtime docstring has no list {title!r}"
    found = []
    for line in doc.split(title, 1)[1].lstrip("\n").splitlines():
        if not line.strip():
            break
        if (step := _STEP.match(line)) is not None:
            found.append(step.group(1))
    assert found, f"no steps under {title!r}"
    return found


def resolve(step: str) -> Callable[..., Any]:
    """The function a step names: the longest importable module, then attributes."""
    name = step if step.startswith("corral.") else f"corral.runtime.{step}"
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            target: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            assert hasattr(target, attr), f"{step}: {target!r} has no {attr!r}"
            target = getattr(target, attr)
        assert inspect.isfunction(target), f"{step} is not a function: {target!r}"
        return target
    raise AssertionError(f"{step}: no such module")


def entered(codes: dict[CodeType, str], order: list[str]) -> Callable[[FrameType, str, Any],
                                                                       None]:
    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            step = codes.get(frame.f_code)
            if step is not None and step not in order:
                order.append(step)
    return profile


async def traced(listed: list[str], call: Callable[[], Any]) -> list[str]:
    """The listed steps in the order `call()` (and what it set off) first entered them."""
    codes = {resolve(step).__code__: step for step in listed}
    order: list[str] = []
    sys.setprofile(entered(codes, order))
    try:
        await call()
    finally:
        sys.setprofile(None)
    return order


class Start(BaseModel):
    pass


class Note(BaseModel):
    text: str


class Notebook(corral.Entity):
    def __init__(self, init: Start) -> None:
        self.notes: list[str] = []

    @corral.signal
    def note(self, n: Note) -> None:
        self.notes.append(n.text)

    @corral.query
    def count(self) -> int:
        return len(self.notes)


def test_every_step_the_signal_path_names_is_a_function_of_corral() -> None:
    for title in (RUNNING, STARTING, RAY):
        for step in steps(title):
            resolve(step)


async def test_a_signal_with_start_takes_the_path_the_runtime_docstring_maps(
        tmp_path: Any) -> None:
    async with corral.open_runtime(str(tmp_path / "path.db"), entities=[Notebook]) as rt:
        ref = rt.ref(Notebook, "n")

        async def send_and_wait(n: int) -> None:
            await ref.signal_with_start(Notebook.note, Note(text="x"), start=Start())
            assert await ref.query(Notebook.count) == n  # applied (read-your-writes)

        listed = steps(STARTING)
        assert await traced(listed, lambda: send_and_wait(1)) == listed
        listed = steps(RUNNING)
        assert await traced(listed, lambda: send_and_wait(2)) == listed
