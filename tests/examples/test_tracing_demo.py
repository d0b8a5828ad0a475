"""The tracing example (`examples/tracing_demo.py`), run as a user runs it: one webhook
over real HTTP gives one trace, from the request to the entity it notified, in order."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_prints_one_trace_from_the_request_to_the_notifier() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "tracing_demo.py")],
                         env=env, check=True, capture_output=True, text=True,
                         timeout=90).stdout
    lines = out.splitlines()[1:]
    shape = [(len(line) - len(line.lstrip())) // 2 for line in lines]
    names = [re.sub(r"  \[.*", "", line.strip()) for line in lines]
    assert list(zip(shape, names, strict=True)) == [
        (0, "POST /webhooks/tickets"),
        (1, "corral accept TicketAgent.customer_reply"),
        (2, "corral apply TicketAgent.customer_reply"),
        (3, "corral step draft:evt-9104"),
        (3, "corral step draft:evt-9104"),
        (3, "corral step draft:evt-9104"),
        (3, "corral send Notifier.note"),
        (4, "corral apply Notifier.note"),
    ], out
    assert [("ERROR" in line) for line in lines[3:6]] == [True, True, False]
