"""Live refresh without a framework: a small script the package serves (`/live.js`).

A page marks what may refresh as `<div id="live" data-live="MILLISECONDS">`; the script
fetches the same URL on that period and swaps in the new page's `#live` (HTML the server
rendered and escaped; `DOMParser` runs no script). It skips a turn while the tab is
hidden, while the operator is in a form inside the region or has typed into one, or
while a `<details>` there is open, so a refresh never eats input. Forms that write (terminate,
query) sit outside the region. A page's `?refresh=SECONDS` sets the period (0: off).
"""

from __future__ import annotations

from ._html import EMPTY, Html, render

__all__ = ["DEFAULT_REFRESH", "LIVE_JS", "live", "refresh_period"]

DEFAULT_REFRESH = 5
"""Seconds between refreshes unless the page's `?refresh=` says otherwise."""
_MAX_REFRESH = 3600

LIVE_JS = """(function () {
  "use strict";
  var region = document.getElementById("live");
  var every = region ? Number(region.getAttribute("data-live")) : 0;
  if (!region || !(every > 0)) { return; }
  var stamp = document.getElementById("refreshed");
  function busy() {
    var active = document.activeElement;
    var edited = Array.prototype.some.call(
      region.querySelectorAll("textarea, input[type=text]"),
      function (field) { return field.value !== field.defaultValue; });
    return document.hidden || edited || (active && active.form && region.contains(active)) ||
      region.querySelector("details[open]") !== null;
  }
  function later() { window.setTimeout(tick, every); }
  function tick() {
    if (busy()) { later(); return; }
    window.fetch(window.location.href, {credentials: "same-origin", cache: "no-store"})
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (text) {
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("live");
        if (fresh && !busy()) {
          region.innerHTML = fresh.innerHTML;
          if (stamp) { stamp.textContent = new Date().toLocaleTimeString(); }
        }
      })
      .catch(function () { if (stamp) { stamp.textContent = "refresh failed; retrying"; } })
      .then(later);
  }
  later();
}());
"""


def live(body: Html, seconds: int) -> Html:
    """`body` as the region the script refreshes every `seconds` (0: never), and the
    line that says so."""
    note = render("<p class=\"muted refresh\">Refreshed every $s s (<code>?refresh=0</code> "
                  "stops it) &middot; last <span id=\"refreshed\">at load</span></p>",
                  s=seconds) if seconds else EMPTY
    return render("<div id=\"live\" data-live=\"$ms\">$body</div>$note", ms=seconds * 1000,
                  body=body, note=note)


def refresh_period(text: str | None) -> int:
    """Seconds between refreshes from `?refresh=` (the default when absent or bad)."""
    if text is None or not (text.isascii() and text.isdecimal() and len(text) <= 4):
        return DEFAULT_REFRESH
    return min(int(text), _MAX_REFRESH)
