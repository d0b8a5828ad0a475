"""The docs' trace picture (`scripts/trace_picture.py`), drawn as the docs' was: from a
real run of the tracing demo, a waterfall page with one row a span in the trace's
order, and its screenshot a PNG of the page's size."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")


def test_the_picture_is_a_screenshot_of_one_webhook_s_waterfall(tmp_path: Path) -> None:
    if not os.access(CHROMIUM, os.X_OK):
        why = f"{CHROMIUM} missing: apt-get install chromium"
        if os.environ.get("CORRAL_REQUIRE_BROWSER") == "1":  # .ci/run: never pass by skipping
            pytest.fail(f"CORRAL_REQUIRE_BROWSER=1 but {why}", pytrace=False)
        pytest.skip(why)
    png, page = tmp_path / "trace.png", tmp_path / "trace.html"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    subprocess.run([sys.executable, str(ROOT / "scripts" / "trace_picture.py"),
                    "--out", str(png), "--html", str(page)],
                   env=env, check=True, capture_output=True, timeout=180)
    names = re.findall(r'<div class="name" style="padding-left:(\d+)px"><b>([^<]+)</b>',
                       page.read_text())
    assert [(int(pad), name) for pad, name in names] == [
        (12, "POST /webhooks/tickets"),
        (30, "corral accept TicketAgent.customer_reply"),
        (48, "corral apply TicketAgent.customer_reply"),
        (66, "corral step draft:evt-9104"),
        (66, "corral step draft:evt-9104"),
        (66, "corral step draft:evt-9104"),
        (66, "corral send Notifier.note"),
        (84, "corral apply Notifier.note"),
    ]
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert (width, height) == (1280, 64 + 27 + 8 * 47 + 8)
