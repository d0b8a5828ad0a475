"""The client API is typed at the call site: mypy (strict) accepts every correct use and
reports exactly the misuses (another type's handler, a wrong payload or start model, a
wrong result type)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

TYPING = Path(__file__).parent / "typing"


def mypy(module: str) -> list[str]:
    """mypy --strict on one module of tests/typing; its error lines."""
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--hide-error-context",
         "--no-error-summary", "--show-error-codes", str(TYPING / module)],
        capture_output=True, text=True, cwd=TYPING, timeout=300,
        env={"MYPYPATH": str(TYPING), "PATH": ""},
    )
    return [line for line in out.stdout.splitlines() if ": error:" in line]


def test_mypy_accepts_every_correct_use() -> None:
    assert mypy("correct.py") == []


def test_mypy_reports_exactly_the_marked_misuses() -> None:
    source = (TYPING / "misuses.py").read_text().splitlines()
    expected = {n for n, line in enumerate(source, 1) if "  # error" in line}
    reported = {int(m.group(1)) for line in mypy("misuses.py")
                if (m := re.search(r"misuses\.py:(\d+):", line))}
    assert reported == expected, (
        f"missed: {sorted(expected - reported)}, unexpected: {sorted(reported - expected)}")
