"""The hash of an entity's code (`EntityDefinition.code`, `actors/_code.py`): a body-only
change is a new build, while the fingerprint (the interface) stays the same.

Each release is a module of the same name, `cart_release`, written to its own folder
and imported in its own process, as two releases of one package are on two hosts.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import corral
from corral.actors._manifest import manifest

SRC = str(Path(corral.__file__).resolve().parents[1])

RELEASE = '''
from pydantic import BaseModel

import corral


class Item(BaseModel):
    sku: str


def _price(sku: str) -> int:
    return {price}


class Cart(corral.Entity):
    def __init__(self) -> None:
        self.items: list[str] = []
        self.total = 0

    @corral.signal
    def add(self, item: Item) -> None:
        self.items.append(item.sku)
        self.total += _price(item.sku)

    async def run(self) -> None:
        await self.wait_for(lambda: {done})
'''


def _release(folder: Path, *, price: str = "len(sku)", done: str = "False") -> Path:
    folder.mkdir(parents=True)
    (folder / "cart_release.py").write_text(RELEASE.format(price=price, done=done))
    return folder


def _identity(folder: Path | None, *, code: str = "import cart_release as m; c = m.Cart",
              seed: str = "0") -> tuple[str, str]:
    """(fingerprint, code) of `Cart` imported in a fresh process from `folder`."""
    path = os.pathsep.join([SRC, str(folder)] if folder else [SRC])
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nd = c._corral_definition\nprint(d.fingerprint, "
                               "d.code)"],
        env={**os.environ, "PYTHONPATH": path, "PYTHONHASHSEED": seed},
        capture_output=True, text=True, timeout=120, check=True, cwd=folder or SRC)
    fingerprint, code_hash = out.stdout.split()
    return fingerprint, code_hash


def test_the_same_source_gives_the_same_code_in_every_process_and_folder(
        tmp_path: Path) -> None:
    a, b = _release(tmp_path / "a"), _release(tmp_path / "deeper" / "b")
    spec = importlib.util.spec_from_file_location("cart_release_here", a / "cart_release.py")
    assert spec is not None
    assert spec.loader is not None
    here = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = here
    try:
        spec.loader.exec_module(here)
        mine = here.Cart._corral_definition
        assert _identity(a, seed="1") == _identity(b, seed="2") == (mine.fingerprint,
                                                                    mine.code)
        assert manifest(mine)["code"] == mine.code
        assert len(mine.code) == 16
        assert set(mine.code) <= set("0123456789abcdef")
    finally:
        del sys.modules[spec.name]


def test_a_body_only_change_of_run_keeps_the_fingerprint_and_is_new_code(
        tmp_path: Path) -> None:
    release_1 = _identity(_release(tmp_path / "r1"))
    release_2 = _identity(_release(tmp_path / "r2", done="self.total > 100"))
    assert release_1[0] == release_2[0]  # the same interface: callers need not change
    assert release_1[1] != release_2[1]


def test_a_change_of_a_helper_in_the_module_is_new_code(tmp_path: Path) -> None:
    release_1 = _identity(_release(tmp_path / "r1"))
    release_2 = _identity(_release(tmp_path / "r2", price="2 * len(sku)"))
    assert release_1[0] == release_2[0]
    assert release_1[1] != release_2[1]


CLASS_WITHOUT_SOURCE = '''
import corral

class Tally(corral.Entity):
    def __init__(self) -> None:
        self.seen = 0
        self.also = 0

    @corral.update
    def count(self) -> int:
        self.seen += 1
        return self.seen

    async def run(self) -> None:
        await self.wait_for(lambda: self.{attr} in {{"a", "b", "c", "d", 0.5, {limit}}})
'''


def _without_source(limit: int = 3, attr: str = "seen") -> str:
    """A class made by `exec` (as in a REPL): no file to read its source from."""
    return f"exec({CLASS_WITHOUT_SOURCE.format(limit=limit, attr=attr)!r})\nc = Tally"


def test_a_class_without_source_is_hashed_by_its_compiled_code_alike_in_every_process(
        ) -> None:
    first = _identity(None, code=_without_source(), seed="1")
    assert _identity(None, code=_without_source(), seed="7") == first
    for change in (_without_source(limit=4), _without_source(attr="also")):
        changed = _identity(None, code=change, seed="1")
        assert changed[0] == first[0]
        assert changed[1] != first[1], change
