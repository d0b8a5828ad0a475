"""The docs' reference of the `corral` command is generated from every command's --help
(scripts/docs_cli_reference.py, a MkDocs hook): each command and subcommand has its
section, and the page has the marker the hook replaces."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_cli_reference_has_every_command_with_its_help(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # where mkdocs.yml's hook is
    hook = importlib.import_module("docs_cli_reference")
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert hook.MARKER in page
    reference = hook.on_page_markdown(page)
    assert hook.MARKER not in reference
    for command in ("ls", "show", "waits", "signal", "deliver", "check-snapshots", "demo",
                    "ui", "dead-letters", "dead-letters list", "dead-letters replay",
                    "dead-letters discard", "deploy roll", "nodes list", "nodes drain",
                    "nodes undrain", "migrate", "backup", "restore"):
        assert f"## `corral {command}`\n" in reference
        assert f"Usage: corral {command} " in reference
    assert "--message-id" in reference  # options come with their help
