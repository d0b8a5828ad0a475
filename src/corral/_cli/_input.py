"""What the write commands read from their caller: the payload (`--payload`/`-p`, as
JSON, from `@file` or `-` for stdin) and the old spelling `--json PAYLOAD`.

A file or stdin is read up to the application's `Limits.max_payload_bytes` and no
further (`-p @/dev/zero` or an endless pipe is refused after that many bytes, never read
until memory runs out): a payload that large could never be accepted anyway.

One flag grammar: `--json` means JSON output on every command; the payload, start input
or query argument is `--payload` (`-p`). `signal` and `deliver` took their payload as
`--json PAYLOAD` before; `legacy_payload` still reads that spelling (a JSON object or
array after `--json`) and says on stderr that it is deprecated.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import typer

from corral._errors import InvalidArgumentError, PayloadTooLargeError

from ._failure import parse_json

__all__ = ["PayloadOption", "legacy_payload", "read_payload"]

PayloadOption = Annotated[str | None, typer.Option(
    "--payload", "-p", metavar="JSON|@FILE|-",
    help="The payload, a JSON value of the handler's model: inline, @FILE to read a file, "
         "or - to read stdin (none for a handler without one).", show_default=False)]

_OLD_PAYLOAD = ("signal", "deliver")


def read_payload(text: str | None, option: str = "--payload", *, max_bytes: int) -> Any:
    """The JSON value of a payload option: inline, `@path` (a file) or `-` (stdin), of
    at most `max_bytes` bytes read; None if the option was not given.

    Raises:
        InvalidArgumentError: the file cannot be read, or is not UTF-8.
        PayloadTooLargeError: the file or stdin holds more than `max_bytes` bytes.
        InvalidPayloadError: not JSON (`parse_json`).
    """
    if text is None:
        return None
    if text == "-":
        where = f"{option} - (stdin)"
        return parse_json(_decoded(_bounded(sys.stdin.buffer, max_bytes, where), where), where)
    if text.startswith("@"):
        where = f"{option} {text}"
        try:
            with Path(text[1:]).open("rb") as file:
                content = _bounded(file, max_bytes, where)
        except OSError as err:
            raise InvalidArgumentError(f"{where}: cannot read it: {err}") from None
        return parse_json(_decoded(content, where), where)
    return parse_json(text, option)


def _bounded(stream: BinaryIO, max_bytes: int, where: str) -> bytes:
    """At most `max_bytes` bytes of `stream`, read to its end (one byte more is read, to
    tell a stream of exactly `max_bytes` from a longer one)."""
    content = stream.read(max_bytes + 1)
    if len(content) > max_bytes:
        raise PayloadTooLargeError(
            f"{where}: more than {max_bytes} bytes (the application's "
            "Limits.max_payload_bytes); stopped reading there")
    return content


def _decoded(content: bytes, where: str) -> str:
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidArgumentError(f"{where}: cannot read it: {err}") from None


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
