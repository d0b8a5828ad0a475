"""HTML by string templates in which every value is escaped unless it is already `Html`.

`render("<td>$key</td>", key=untrusted)` escapes `untrusted` (`html.escape`, quotes
included, so values are safe in double-quoted attributes too); fragments built by
`render` are `Html` and pass through as they are. Nothing else produces `Html`, so an
unescaped string cannot reach a page by accident.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from string import Template
from typing import Any
from urllib.parse import quote, urlencode

__all__ = [
    "EMPTY",
    "STYLE",
    "Html",
    "age",
    "entity_url",
    "join",
    "layout",
    "opt",
    "pretty_json",
    "query_url",
    "render",
    "when",
]


class Html(str):
    """Text that is HTML already (made by `render` or `join`), never escaped again."""

    __slots__ = ()


EMPTY = Html("")
"""No HTML at all."""


def _escaped(value: object) -> str:
    return value if isinstance(value, Html) else html.escape(str(value), quote=True)


def render(template: str, **values: object) -> Html:
    """`template` (a `string.Template`: `$name`) with each value escaped unless `Html`."""
    return Html(Template(template).substitute({k: _escaped(v) for k, v in values.items()}))


def join(parts: Iterable[Html], sep: str = "\n") -> Html:
    """Fragments one after the other (each must be `Html` already)."""
    items = list(parts)
    if not all(isinstance(p, Html) for p in items):
        raise TypeError("join takes Html fragments only (escape with render)")
    return Html(sep.join(items))


def opt(value: object) -> object:
    """A value for a cell, or an em dash for None."""
    return "\u2014" if value is None else value


def when(timestamp: float | None) -> str:
    """A point in time (seconds since the epoch) in UTC, to the second."""
    if timestamp is None:
        return "\u2014"
    return datetime.fromtimestamp(timestamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def age(seconds: float | None) -> str:
    """A duration, in the largest unit that keeps it readable."""
    if seconds is None:
        return "\u2014"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if abs(seconds) >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


def pretty_json(text: str | None) -> str:
    """Stored JSON text, indented for reading (as it is, if it does not parse)."""
    if text is None:
        return ""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):  # damaged, or nested too deeply to show
        return text


def entity_url(entity_type: str, key: str) -> str:
    """The detail page of one entity (each part percent-encoded, `/` in a key too)."""
    return f"/entities/{quote(entity_type, safe='')}/{quote(key, safe='')}"


def query_url(path: str, params: Mapping[str, Any]) -> str:
    """`path` with the non-empty `params` as its query string."""
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return f"{path}?{urlencode(kept)}" if kept else path


STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; color: #1d232b; background: #f6f7f9; }
header { display: flex; justify-content: space-between; align-items: center;
         padding: .6rem 1.2rem; background: #1d232b; color: #fff; }
header a { color: #fff; margin-right: 1.2rem; text-decoration: none; font-weight: 600; }
header form { display: inline; margin-left: .8rem; }
main { padding: 1rem 1.2rem 3rem; max-width: 80rem; }
h1 { font-size: 1.35rem; margin: .4rem 0 1rem; }
h2 { font-size: 1.1rem; margin: 1.6rem 0 .5rem; }
table { border-collapse: collapse; background: #fff; width: 100%; }
th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid #e3e6ea;
         vertical-align: top; }
th { background: #eef0f3; font-weight: 600; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .25rem 1.2rem;
           background: #fff; padding: .8rem 1rem; }
dl.facts dt { font-weight: 600; }
dl.facts dd { margin: 0; }
pre { background: #fff; border: 1px solid #e3e6ea; padding: .5rem; overflow: auto;
      max-height: 20rem; margin: .2rem 0; white-space: pre-wrap; }
textarea { width: 100%; min-height: 5rem; font-family: ui-monospace, monospace; }
input[type=text] { width: 22rem; }
.card { background: #fff; border: 1px solid #e3e6ea; padding: .8rem 1rem; margin: .6rem 0; }
.flash { padding: .7rem 1rem; margin: 0 0 1rem; border-left: 4px solid #2f7d32;
         background: #edf7ee; }
.error { border-left-color: #b3261e; background: #fbeceb; }
.status { font-weight: 600; }
.muted { color: #5c6670; }
.filters { margin-bottom: .8rem; }
.filters label { margin-right: .8rem; }
button { cursor: pointer; }
tr.suspended td, .status.suspended { background: #fff4e5; color: #8a4b00; }
.suspension { border-left: 4px solid #e08a00; }
tr.message.dead_lettered td { background: #fbeceb; }
tr.message.accepted td.status { color: #8a4b00; }
nav.tabs { margin: 0 0 .8rem; }
nav.tabs a.tab { margin-right: 1rem; }
nav.tabs a.current { font-weight: 700; text-decoration: none; color: inherit; }
.actions form { margin: .4rem 0 .8rem; }
.refresh { font-size: .85rem; }
"""

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title \u00b7 corral</title>
<link rel="stylesheet" href="/style.css">
<script src="/live.js" defer></script>
</head>
<body>
<header>
<nav><a href="/">Entities</a><a href="/waits">Open waits</a>
<a href="/dead-letters">Dead letters</a><a href="/schedules">Schedules</a></nav>
<div>$who</div>
</header>
<main>
<h1>$title</h1>
$body
</main>
</body>
</html>
"""


def layout(title: str, body: Html, who: Html = EMPTY) -> Html:
    """A whole page: navigation, who is signed in, the title and `body`."""
    return render(_PAGE, title=title, body=body, who=who)
