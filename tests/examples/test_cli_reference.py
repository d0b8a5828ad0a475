"""The docs' reference of the `corral` command is generated from every command's --help
(scripts/docs_cli_reference.py, a MkDocs hook): each command and subcommand has its
section, and the page has the marker the hook replaces."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "scripts" / "docs_cli_reference.py"


def test_the_cli_reference_has_every_command_with_its_help() -> None:
    spec = importlib.util.spec_from_file_location("docs_cli_reference", HOOK)
    assert spec is not None
    assert spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert hook.MARKER in page
    reference = hook.on_page_markdown(page)
    assert hook.MARKER not in reference
    for command in ("ls", "show", "waits", "signal", "deliver", "check-snapshots", "demo",
                    "ui", "dead-letters", "dead-letters list", "dead-letters replay",
                    "dead-letters discard"):
        assert f"## `corral {command}`\n" in reference
        assert f"Usage: corral {command} " in reference
    assert "--message-id" in reference  # options come with their help
