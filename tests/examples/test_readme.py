"""Every Python snippet of the README runs as written, in order, in one namespace (later
snippets use what earlier ones define), with the output it says it prints."""

from __future__ import annotations

import os
import re
import sys
import types
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def snippets() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), re.M | re.S)


def test_the_readme_has_the_snippets_this_test_runs() -> None:
    blocks = snippets()
    assert len(blocks) >= 5
    assert any("open_test_runtime" in b for b in blocks)
    assert any('backend="ray"' in b for b in blocks)


def test_every_readme_snippet_runs_as_written(
    tmp_path: Path, ray_address: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # the snippets open "corral.db" in the working directory
    # Run as a script would: classes of `__main__` reach Ray's shard actors by value.
    module = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", module)
    for n, block in enumerate(snippets(), 1):
        try:
            exec(compile(block, f"README.md snippet {n}", "exec"), module.__dict__)
        except Exception as err:
            raise AssertionError(f"README snippet {n} failed:\n{block}") from err
    out = capsys.readouterr().out
    assert "Ack(status='accepted', run_id=1, seq=1, started=True)" in out
    assert "Ack(status='duplicate', run_id=1, seq=1, started=True)" not in out
    assert re.search(r"Ack\(status='duplicate', run_id=1, seq=1, started=False\)", out)
    assert "Ack(status='accepted', run_id=1, seq=2, started=False)" in out  # through Ray
    assert "reminder: pay invoice 77" in out
    assert "True" in out  # the reminder's start started a run
    assert "['already_delivered', 'delivered']\nduplicate True\nexpired stale" in out
    assert "True\n3 notes by email, high, triage\n" in out  # "Changing entity code"
    assert os.path.exists(tmp_path / "corral.db")
