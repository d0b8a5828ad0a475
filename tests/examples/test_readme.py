"""Every ```python snippet of the README and of the docs runs as written, with the output
it says it prints (docs/contributing.md states the convention: ```py blocks are
fragments, shown and never run). The README's snippets run in order in one namespace;
the docs' run page after page in the order of mkdocs.yml's nav, in another shared
namespace, so a page may use what an earlier page defined."""

from __future__ import annotations

import os
import re
import sys
import types
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def snippets(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.M | re.S)


def nav_pages() -> list[Path]:
    """The docs pages in the order of mkdocs.yml's nav."""

    def walk(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [page for item in node for page in walk(item)]
        if isinstance(node, dict):
            return [page for value in node.values() for page in walk(value)]
        return []

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    return [DOCS / page for page in walk(nav)]


def run_snippets(pages: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    # Run as a script would, in `__main__`. A Ray deployment imports its classes from a
    # module, which these snippets are not: the pages show it in ```py blocks.
    module = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", module)
    for page in pages:
        for n, block in enumerate(snippets(page), 1):
            name = f"{page.relative_to(ROOT)} snippet {n}"
            try:
                exec(compile(block, name, "exec"), module.__dict__)
            except Exception as err:
                raise AssertionError(f"{name} failed:\n{block}") from err


def test_every_docs_page_is_in_the_nav_and_names_the_package_version() -> None:
    found = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert found is not None
    version = found[1]
    pages = sorted(DOCS.rglob("*.md"))
    assert sorted(nav_pages()) == pages
    for page in pages:
        assert f"corral {version}" in page.read_text(), f"{page} names no version {version}"


def test_the_readme_links_to_files_that_exist() -> None:
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    assert any(t.startswith("docs/") for t in targets)
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert missing == []


def test_the_readme_shows_the_test_command_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    command = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && scripts/check"
    assert f"\n{command}\n" in ci
    assert f"\n{command}\n" in README.read_text()


def test_the_docs_have_the_snippets_this_test_runs() -> None:
    blocks = [b for page in nav_pages() for b in snippets(page)]
    assert len(blocks) >= 7
    assert any("open_test_runtime" in b for b in blocks)
    assert any('backend="ray"' in b for b in blocks)
    assert len(snippets(README)) == 1


def test_every_readme_snippet_runs_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # the snippets open "corral.db" in the working directory
    run_snippets([README], monkeypatch)
    out = capsys.readouterr().out
    assert "Ack(status='accepted', run_id=1, seq=1, started=True)" in out
    assert re.search(r"Ack\(status='duplicate', run_id=1, seq=1, started=False\)", out)
    assert os.path.exists(tmp_path / "corral.db")


def test_every_docs_snippet_runs_as_written(
    tmp_path: Path, ray_address: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # the snippets open "corral.db" in the working directory
    run_snippets(nav_pages(), monkeypatch)
    out = capsys.readouterr().out
    assert "Ack(status='accepted', run_id=1, seq=1, started=True)" in out
    assert "Ack(status='duplicate', run_id=1, seq=1, started=True)" not in out
    assert re.search(r"Ack\(status='duplicate', run_id=1, seq=1, started=False\)", out)
    assert "reminder: pay invoice 77" in out
    assert "True" in out  # the reminder's start started a run
    assert "['already_delivered', 'delivered']\nduplicate True\nexpired stale" in out
    assert "True\n3 notes by email, high, triage\n" in out  # "Changing entity code"
    assert os.path.exists(tmp_path / "corral.db")
