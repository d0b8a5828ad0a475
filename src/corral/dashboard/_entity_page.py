"""An entity's page beyond its facts: runs with their start input and result, what is in
it (the latest snapshot's state and the messages after it), its history (messages,
waits, timers, durable steps), and the forms that act on it (terminate, query)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from corral import (
    EntityDescription,
    EntityHistory,
    EntityState,
    MessageInfo,
    RunSummary,
    StepInfo,
)

from ._forms import Visit, query_form, terminate_form
from ._html import EMPTY, Html, age, entity_url, join, opt, query_url, render, when

__all__ = ["actions", "history_view", "messages_table", "query_result", "runs_table",
           "state_panel", "steps_table", "tabs"]


def _data(value: Any, *, indent: int | None = None) -> str:
    """JSON data as text (an em dash for None)."""
    if value is None:
        return "\u2014"
    return json.dumps(value, ensure_ascii=False, indent=indent,
                      separators=None if indent else (",", ":"))


_RUN_ROW = """<tr><td>$run</td><td>$status</td><td>$started</td><td>$closed</td>
<td>$continued</td><td><code>$start</code></td><td><code class="result">$result</code></td>
<td>$error</td></tr>"""


def runs_table(runs: Sequence[RunSummary]) -> Html:
    """Every run: status, times, start input, result (a completed run's), error."""
    rows = [render(_RUN_ROW, run=r.run_id, status=r.status.value, started=when(r.started_at),
                   closed=when(r.closed_at), continued=opt(r.continued_from),
                   start=_data(r.start_input), result=_data(r.result),
                   error=render("<pre>$e</pre>", e=r.error) if r.error else "")
            for r in runs]
    return render(
        "<table class=\"runs\" id=\"runs\"><thead><tr><th>Run</th><th>Status</th>"
        "<th>Started</th><th>Closed</th><th>Continued from</th><th>Start input</th>"
        "<th>Result</th><th>Error</th></tr></thead><tbody>$rows</tbody></table>",
        rows=join(rows) if rows else render("<tr><td colspan=\"8\">Never ran.</td></tr>"))


_MESSAGE_ROW = """<tr class="message $status"><td>$seq</td><td>$run</td><td>$kind</td>
<td>$name</td><td class="status">$status</td><td><code>$message_id</code></td><td>$sender</td>
<td>$accepted</td><td><code>$payload</code></td>$dead</tr>"""


def messages_table(items: Sequence[MessageInfo], *, dead_letters: bool, table_id: str) -> Html:
    """Messages in seq order; with `dead_letters`, each one's dead letter and error."""
    head = "".join(f"<th>{h}</th>" for h in (
        "Seq", "Run", "Kind", "Name", "Status", "Message id", "Sender", "Accepted",
        "Payload", *(["Dead letter"] if dead_letters else [])))
    rows = [render(_MESSAGE_ROW, seq=m.seq, run=m.run_id, kind=opt(m.kind), name=opt(m.name),
                   status=m.status, message_id=m.message_id, sender=opt(m.sender),
                   accepted=when(m.accepted_at),
                   payload="\u2014" if m.kind is None else _data(m.payload),
                   dead=render("<td>$d</td>", d=f"{m.dead_letter_id}: {m.error}"
                               if m.dead_letter_id is not None else "\u2014")
                   if dead_letters else EMPTY)
            for m in items]
    cols = 10 if dead_letters else 9
    return render("<table class=\"messages\" id=\"$id\"><thead><tr>$head</tr></thead>"
                  "<tbody>$rows</tbody></table>", id=table_id, head=Html(head),
                  rows=join(rows) if rows else
                  render("<tr><td colspan=\"$n\">No messages.</td></tr>", n=cols))


def _more(path: str, params: dict[str, object], cursor: str | None, label: str) -> Html:
    if cursor is None:
        return EMPTY
    return render("<p><a rel=\"next\" href=\"$url\">$label &rarr;</a></p>",
                  url=query_url(path, {**params, "after": cursor}), label=label)


def state_panel(state: EntityState | None) -> Html:
    """The latest snapshot's state as JSON, its untaken mailbox, and the messages after
    it with their payloads (the first page; `?after=` pages on)."""
    if state is None:
        return render("<p class=\"muted\">Never started: no state.</p>")
    if state.snapshot_seq is None:
        head = render("<p class=\"muted\">No snapshot yet: the state is rebuilt from the "
                      "messages below.</p>")
    else:
        head = render("<p>Snapshot at seq $seq (state version $version):</p>"
                      "<pre id=\"state\">$state</pre>", seq=state.snapshot_seq,
                      version=opt(state.state_version), state=_data(state.state, indent=2))
    mailbox = EMPTY if not state.mailbox else render(
        "<p>Mailbox: $n payload(s) applied, not taken by run() yet.</p><pre>$items</pre>",
        n=len(state.mailbox), items="\n".join(_data(m) for m in state.mailbox))
    url = entity_url(state.entity_type, state.key)
    return join([head, mailbox, render("<h3>Messages after the snapshot</h3>"),
                 messages_table(state.pending.items, dead_letters=False, table_id="pending"),
                 _more(url, {}, state.pending.next_cursor, "More messages")])


def tabs(entity_type: str, key: str, current: str) -> Html:
    """Overview / History links."""
    url = entity_url(entity_type, key)
    items = [render("<a href=\"$u\" class=\"$cls\">$label</a>", u=u, label=label,
                    cls="tab current" if name == current else "tab")
             for name, u, label in (("overview", url, "Overview"),
                                    ("history", query_url(url, {"view": "history"}), "History"))]
    return render("<nav class=\"tabs\">$items</nav>", items=join(items, " "))


def _took(seconds: float) -> str:
    """A step's duration: to the millisecond under a minute, else `age`'s units."""
    return f"{seconds:.3f} s" if seconds < 60 else age(seconds)


_STEP_ROW = """<tr class="step $status"><td>$run</td><td><code>$name</code></td>
<td class="status">$status</td><td class="attempts">$attempts</td><td>$started</td>
<td>$duration</td><td>$where</td><td><code class="result">$result</code></td>
<td>$error</td></tr>"""


def steps_table(steps: Sequence[StepInfo]) -> Html:
    """Each durable step: its attempts, duration, outcome (the result's summary, or the
    last error with its traceback folded under it) and where it ran."""
    rows = [render(_STEP_ROW, run=s.run_id, name=s.name, status=s.status,
                   attempts=s.attempts, started=when(s.started_at), duration=_took(s.duration),
                   where=(f"Ray task on {s.node}" if s.node else "Ray task") if s.ray_task
                   else "host", result=opt(s.result),
                   error=EMPTY if s.error is None else render(
                       "<details><summary>$e</summary><pre class=\"traceback\">$t</pre>"
                       "</details>", e=s.error, t=s.traceback or ""))
            for s in steps]
    return render(
        "<table class=\"steps\" id=\"steps\"><thead><tr><th>Run</th><th>Step</th>"
        "<th>Status</th><th>Attempts</th><th>Started</th><th>Duration</th><th>Ran</th>"
        "<th>Result</th><th>Last error</th></tr></thead><tbody>$rows</tbody></table>",
        rows=join(rows) if rows else render("<tr><td colspan=\"9\">No steps.</td></tr>"))


def history_view(h: EntityHistory) -> Html:
    """Runs, a page of messages (accepted, applied, dead-lettered), waits, timers and
    durable steps."""
    waits = [render("<tr><td>$run</td><td>$name</td><td class=\"status\">$status</td>"
                    "<td>$opened</td><td>$deadline</td><td>$key</td><td>$sender</td>"
                    "<td>$at</td></tr>", run=w.run_id, name=w.name, status=w.status.value,
                    opened=when(w.opened_at), deadline=when(w.deadline),
                    key=opt(w.delivery_key), sender=opt(w.sender), at=when(w.delivered_at))
             for w in h.waits]
    timers = [render("<tr><td>$run</td><td><code>$id</code></td><td>$due</td></tr>",
                     run=t.run_id, id=t.timer_id, due=when(t.due_at)) for t in h.timers]
    url = entity_url(h.entity_type, h.key)
    return join([
        render("<p>Applied up to seq $seq (as known from the latest snapshot, or live here)."
               "</p>", seq=opt(h.applied_seq)),
        render("<h2>Runs</h2>"), runs_table(h.runs),
        render("<h2>Messages</h2>"),
        messages_table(h.messages.items, dead_letters=True, table_id="messages"),
        _more(url, {"view": "history"}, h.messages.next_cursor, "Next messages"),
        render("<h2>Signal waits</h2><table id=\"waits\"><thead><tr><th>Run</th><th>Wait"
               "</th><th>Status</th><th>Opened</th><th>Deadline</th><th>Delivery key</th>"
               "<th>Decided by</th><th>Decided at</th></tr></thead><tbody>$rows</tbody>"
               "</table>", rows=join(waits) if waits else
               render("<tr><td colspan=\"8\">No waits.</td></tr>")),
        render("<h2>Timers</h2><table id=\"timers\"><thead><tr><th>Run</th><th>Timer</th>"
               "<th>Due</th></tr></thead><tbody>$rows</tbody></table>",
               rows=join(timers) if timers else
               render("<tr><td colspan=\"3\">No timers.</td></tr>")),
        render("<h2>Steps</h2>"), steps_table(h.steps),
    ])


def actions(visit: Visit, d: EntityDescription, queries: list[str]) -> Html:
    """Terminate (a running run) and the query form, outside the refreshed region."""
    parts: list[Html] = []
    if queries and d.run_id:
        parts.append(query_form(visit, d.entity_type, d.key, queries))
    if d.status.value == "running":
        parts.append(terminate_form(visit, d.entity_type, d.key, d.run_id))
    if not parts:
        return EMPTY
    return render("<div class=\"card actions\"><h2>Act</h2>$parts</div>", parts=join(parts))


def query_result(entity_type: str, key: str, name: str, result: Any) -> Html:
    """What a query answered."""
    return render("<div class=\"flash\" role=\"status\" id=\"message\">$type $key &middot; "
                  "query <strong>$name</strong> answered:</div><pre id=\"query-result\">"
                  "$result</pre><p><a href=\"$url\">Back to $type $key</a></p>",
                  type=entity_type, key=key, name=name, result=_data(result, indent=2),
                  url=entity_url(entity_type, key))
