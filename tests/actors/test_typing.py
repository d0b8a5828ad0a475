"""The client API is typed at the call site: mypy (strict) accepts every correct use and
reports exactly the misuses (another type's handler, a wrong payload or start model, a
wrong result type)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

TYPING = Path(__file__).resolve().parents[1] / "support" / "typing"


@pytest.fixture(scope="module")
def reported() -> dict[str, set[int]]:
    """One mypy --strict run over both modules of tests/support/typing: the error lines of each."""
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--hide-error-context",
         "--no-error-summary", "--show-error-codes", "correct.py", "misuses.py"],
        capture_output=True, text=True, cwd=TYPING, timeout=300,
        env={"MYPYPATH": str(TYPING), "PATH": ""},
    )
    lines: dict[str, set[int]] = {}
    for line in out.stdout.splitlines():
        m = re.match(r"(\w+\.py):(\d+): error:", line)
        assert m is not None or ": error:" not in line, line
        if m is not None:
            lines.setdefault(m.group(1), set()).add(int(m.group(2)))
    assert out.returncode in (0, 1), out.stdout + out.stderr  # 2: mypy itself failed
    return lines


def test_mypy_accepts_every_correct_use(reported: dict[str, set[int]]) -> None:
    assert {module: errors for module, errors in reported.items()
            if module != "misuses.py"} == {}


def test_mypy_reports_exactly_the_marked_misuses(reported: dict[str, set[int]]) -> None:
    source = (TYPING / "misuses.py").read_text().splitlines()
    expected = {n for n, line in enumerate(source, 1) if "  # error" in line}
    errors = reported.get("misuses.py", set())
    assert errors == expected, (
        f"missed: {sorted(expected - errors)}, unexpected: {sorted(errors - expected)}")
