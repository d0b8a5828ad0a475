"""What the write commands read from their caller: the payload (`--payload`/`-p`, as
JSON, from `@file` or `-` for stdin) and the old spelling `--json PAYLOAD`.

One flag grammar: `--json` means JSON output on every command; the payload, start input
or query argument is `--payload` (`-p`). `signal` and `deliver` took their payload as
`--json PAYLOAD` before; `legacy_payload` still reads that spelling (a JSON object or
array after `--json`) and says on stderr that it is deprecated.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from corral._errors import InvalidArgumentError

from ._errors import parse_json

__all__ = ["PayloadOption", "legacy_payload", "read_payload"]

PayloadOption = Annotated[str | None, typer.Option(
    "--payload", "-p", metavar="JSON|@FILE|-",
    help="The payload, a JSON value of the handler's model: inline, @FILE to read a file, "
         "or - to read stdin (none for a handler without one).", show_default=False)]

_OLD_PAYLOAD = ("signal", "deliver")


def read_payload(text: str | None, option: str = "--payload") -> Any:
    """The JSON value of a payload option: inline, `@path` (a file) or `-` (stdin);
    None if the option was not given.

    Raises:
        InvalidArgumentError: the file cannot be read.
        InvalidPayloadError: not JSON (`parse_json`).
    """
    if text is None:
        return None
    if text == "-":
        return parse_json(sys.stdin.read(), f"{option} - (stdin)")
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            content = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise InvalidArgumentError(f"{option} {text}: cannot read it: {err}") from None
        return parse_json(content, f"{option} {text}")
    return parse_json(text, option)


def legacy_payload(args: Sequence[str]) -> list[str]:
    """`args` with `signal`/`deliver`'s old `--json PAYLOAD` as `--payload PAYLOAD` (a
    deprecation line on stderr); any other command line as it is."""
    found = list(args)
    command = next((a for a in found if not a.startswith("-")), None)
    if command not in _OLD_PAYLOAD:
        return found
    for i, arg in enumerate(found[:-1]):
        if arg == "--json" and found[i + 1].lstrip()[:1] in ("{", "["):
            print("corral: `--json PAYLOAD` is deprecated: pass the payload as --payload "
                  "(or -p); --json now asks for JSON output", file=sys.stderr)
            found[i] = "--payload"
    return found
