"""Draw docs/trace.png, the trace shown in docs/guides/tracing.md, from a real run.

    .venv/bin/python scripts/trace_picture.py            # writes docs/trace.png
    .venv/bin/python scripts/trace_picture.py --html t.html  # also keeps the page

Runs `examples/tracing_demo.py` (one webhook over real HTTP: the request, corral's
accept and apply, three attempts of a model step, a send, the receiver's apply), takes
the spans of its trace from the SDK's in-memory exporter, lays them out as a waterfall
(what a trace viewer such as Jaeger shows: one row a span, under its parent, a bar from
its start to its end on the trace's time axis) in an HTML page, and has headless
Chromium (Debian's `chromium`) take a screenshot of the page.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import tracing_demo  # noqa: E402 (examples/ on the path first)

WIDTH = 1280  # the page, in CSS pixels
ROW = 46
SHOWN = ("corral.key", "corral.seq", "corral.run_id", "corral.outcome", "corral.step.attempt",
         "corral.target_key", "http.status_code")


def _colour(span: ReadableSpan) -> str:
    if not span.status.is_ok:
        return "#d64545"
    if span.kind is SpanKind.SERVER:
        return "#7a869a"
    for prefix, colour in (("corral accept", "#3b73d9"), ("corral apply", "#2f9e6e"),
                           ("corral step", "#e08a1e"), ("corral send", "#8a5cd6")):
        if span.name.startswith(prefix):
            return colour
    return "#7a869a"


def _ms(ns: int) -> str:
    ms = ns / 1e6
    return f"{ms:.2f} ms" if ms < 10 else f"{ms:.1f} ms"


def page(spans: Sequence[ReadableSpan]) -> str:
    """The waterfall of `spans` (one trace) as a self-contained HTML page."""
    rows = tracing_demo.ordered(spans)
    begin = min(s.start_time or 0 for s in spans)
    total = max(s.end_time or 0 for s in spans) - begin
    context = spans[0].context
    assert context is not None
    root = rows[0][1]
    caller = "" if root.parent is None else \
        f" &middot; continues the caller's span {root.parent.span_id:016x}"
    ticks = "".join(
        f'<div class="tick" style="left:{100 * i / 5:.1f}%"><span>{_ms(total * i // 5)}'
        f"</span></div>" for i in range(6))
    lines = []
    for depth, s in rows:
        start, end = (s.start_time or 0) - begin, (s.end_time or 0) - begin
        left, width = 100 * start / total, max(100 * (end - start) / total, 0.15)
        a = s.attributes or {}
        shown = " ".join(f"{k.removeprefix('corral.')}={a[k]!s}" for k in SHOWN if k in a)
        if not s.status.is_ok:
            shown += f"  {s.status.description}"
        kind = s.kind.name.lower()
        lines.append(
            f'<div class="row"><div class="name" style="padding-left:{12 + 18 * depth}px">'
            f'<b>{html.escape(s.name)}</b> <i>{kind}</i><br><small>{html.escape(shown)}'
            f'</small></div><div class="lane">{ticks.replace("<span>", "<span hidden>")}'
            f'<div class="bar" style="left:{left:.3f}%;width:{width:.3f}%;'
            f'background:{_colour(s)}"></div><div class="dur" style="left:calc('
            f'{left + width:.3f}% + 6px)">{_ms(end - start)}</div></div></div>')
    return f"""<!doctype html><meta charset="utf-8"><style>
body {{ margin: 0; font: 13px/1.35 "DejaVu Sans", sans-serif; color: #1d2330;
       background: #fff; width: {WIDTH}px; }}
header {{ padding: 14px 16px 10px; border-bottom: 1px solid #d9dde5; }}
header h1 {{ font-size: 16px; margin: 0 0 4px; }}
header span {{ color: #5b6475; }}
.row, .axis {{ display: flex; border-bottom: 1px solid #eef0f4; }}
.row {{ height: {ROW}px; }}
.name {{ width: 470px; flex: none; box-sizing: border-box; padding-top: 5px;
         overflow: hidden; white-space: nowrap; border-right: 1px solid #d9dde5; }}
.name i {{ color: #8a93a3; font-style: normal; font-size: 11px; }}
.name small {{ color: #5b6475; font-size: 11px; }}
.lane {{ position: relative; flex: 1; margin-right: 90px; }}
.tick {{ position: absolute; top: 0; bottom: 0; border-left: 1px solid #eef0f4; }}
.axis .tick span {{ position: absolute; top: 6px; left: 4px; color: #5b6475;
                    font-size: 11px; white-space: nowrap; }}
.axis {{ height: 26px; background: #f6f7f9; }}
.bar {{ position: absolute; top: 14px; height: 16px; border-radius: 2px; }}
.dur {{ position: absolute; top: 14px; color: #3d4555; font-size: 11px;
        white-space: nowrap; }}
</style>
<header><h1>{html.escape(root.name)}</h1>
<span>trace {context.trace_id:032x}{caller} &middot; {len(spans)} spans &middot;
{_ms(total)} &middot; the SDK's in-memory exporter, examples/tracing_demo.py</span>
</header>
<div class="axis"><div class="name"></div><div class="lane">{ticks}</div></div>
{"".join(lines)}
"""


def screenshot(html_text: str, out: Path, *, rows: int, keep: Path | None) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("needs Debian's chromium (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        source = keep or Path(tmp) / "trace.html"
        source.write_text(html_text, encoding="utf-8")
        height = 64 + 27 + rows * (ROW + 1) + 8
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", f"--user-data-dir={tmp}/profile",
                        f"--window-size={WIDTH},{height}", f"--screenshot={out}",
                        source.resolve().as_uri()],
                       check=True, capture_output=True, timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "trace.png")
    parser.add_argument("--html", type=Path, help="also keep the page here")
    args = parser.parse_args()
    spans = asyncio.run(tracing_demo.one_webhook())
    screenshot(page(spans), args.out, rows=len(spans), keep=args.html)
    print(f"wrote {args.out} ({len(spans)} spans)")


if __name__ == "__main__":
    main()
