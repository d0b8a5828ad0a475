"""Command groups whose bare name lists: `corral dead-letters`, `corral nodes`."""

from __future__ import annotations

from typing import Any

from typer.core import TyperGroup

__all__ = ["ListUnlessNamed"]


class ListUnlessNamed(TyperGroup):
    """`corral GROUP [ARGS] ...` is `corral GROUP list [ARGS] ...`: a first word that
    names no subcommand belongs to `list`."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands
                        and args[0] not in ctx.help_option_names):
            args = ["list", *args]
        return super().parse_args(ctx, args)
