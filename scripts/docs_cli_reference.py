"""MkDocs hook (mkdocs.yml `hooks:`): writes the `corral` command's reference into
docs/reference/cli.md where the page says `<!-- corral --help -->`, from the commands
themselves (`corral ... --help` of every command and subcommand), so it cannot drift."""

from __future__ import annotations

from typing import Any

import typer.core
import typer.main
from typer.testing import CliRunner

MARKER = "<!-- corral --help -->"


def _commands(cmd: Any, path: list[str]) -> list[list[str]]:
    """`path` and every command below it, depth first, in the order `--help` lists them."""
    found = [path]
    if isinstance(cmd, typer.core.TyperGroup):
        ctx = cmd.context_class(cmd)
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None:
                found += _commands(sub, [*path, name])
    return found


def cli_reference() -> str:
    from corral._cli._main import app

    runner = CliRunner()
    sections = []
    for path in _commands(typer.main.get_command(app), []):
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "88", "NO_COLOR": "1"})
        if result.exit_code != 0:
            raise RuntimeError(f"corral {' '.join(path)} --help failed:\n{result.output}")
        help_text = "\n".join(line.rstrip() for line in result.output.strip("\n").splitlines())
        sections.append(f"## `{' '.join(['corral', *path])}`\n\n```text\n{help_text}\n```\n")
    return "\n".join(sections)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return markdown.replace(MARKER, cli_reference()) if MARKER in markdown else markdown
