"""The dashboard's pages, as `Html` bodies for `layout` (every value escaped)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel

from corral import (
    DeadLetter,
    Delivery,
    EntityDescription,
    EntityState,
    EntitySummary,
    Page,
    RunStatus,
    SignalWaitInfo,
)

from ._entity_page import actions, runs_table, state_panel, tabs
from ._forms import Visit, dead_letter_buttons, deliver_form
from ._html import EMPTY, Html, age, entity_url, join, opt, pretty_json, query_url, render, when
from ._live import DEFAULT_REFRESH, live

__all__ = ["dead_letters_page", "delivery_result", "entity_detail", "entity_list",
           "message", "waits_page"]

STATUSES = [s.value for s in RunStatus if s is not RunStatus.NEVER_STARTED]

Models = Mapping[tuple[str, str], type[BaseModel]]
"""Each wait's payload model, by (entity type, wait name)."""


def _select(name: str, label: str, options: Sequence[str], chosen: str | None) -> Html:
    items = [render("<option value=\"\">any</option>")]
    items += [render("<option value=\"$v\"$sel>$v</option>", v=o,
                     sel=Html(" selected") if o == chosen else "") for o in options]
    return render("<label>$label <select name=\"$name\">$items</select></label>",
                  label=label, name=name, items=join(items, ""))


def _filters(action: str, types: Sequence[str], chosen_type: str | None,
             extra: Html = EMPTY) -> Html:
    return render("<form method=\"get\" action=\"$action\" class=\"filters\">$type$extra"
                  "<button type=\"submit\">Filter</button></form>", action=action,
                  type=_select("type", "Type", types, chosen_type), extra=extra)


def _entity_link(entity_type: str, key: str) -> Html:
    return render("<a href=\"$url\" class=\"entity\">$key</a>",
                  url=entity_url(entity_type, key), key=key)


def _next_link(path: str, params: Mapping[str, object], cursor: str | None) -> Html:
    if cursor is None:
        return render("<p class=\"muted\">End of the list.</p>")
    return render("<p><a rel=\"next\" href=\"$url\">Next page &rarr;</a></p>",
                  url=query_url(path, {**params, "after": cursor}))


_ENTITY_ROW = """<tr class="$cls"><td>$type</td><td>$key</td><td class="status">$status</td>
<td>$run</td><td>$accepted</td><td>$applied</td><td class="backlog">$backlog</td>
<td>$oldest</td><td>$mailbox</td><td>$passivated</td><td>$updated</td></tr>"""


def entity_list(page: Page[EntitySummary], types: Sequence[str], chosen_type: str | None,
                chosen_status: str | None, limit: int, prefix: str | None, refresh: int
                ) -> Html:
    """Entities in (type, key) order, filtered by type, status and key prefix, one page
    (refreshed live)."""
    extra = join([_select("status", "Status", STATUSES, chosen_status),
                  render("<label>Key starts with <input type=\"search\" name=\"key\" "
                         "value=\"$prefix\" maxlength=\"512\"></label>", prefix=prefix or ""),
                  render("<label>Per page <input type=\"number\" name=\"limit\" min=\"1\" "
                         "max=\"1000\" value=\"$limit\"></label>", limit=limit)], "")
    rows = [render(_ENTITY_ROW, cls="suspended" if e.suspended else "",
                   type=e.entity_type, key=_entity_link(e.entity_type, e.key),
                   status=f"{e.status.value} (suspended)" if e.suspended else e.status.value,
                   run=e.run_id, accepted=e.accepted_seq, applied=opt(e.applied_seq),
                   backlog=opt(e.backlog), oldest=_waited(e.oldest_unapplied_age),
                   mailbox=opt(e.mailbox_depth),
                   passivated="yes" if e.passivated else "no", updated=when(e.updated_at))
            for e in page.items]
    table = render(
        "<table class=\"entities\"><thead><tr><th>Type</th><th>Key</th><th>Status</th>"
        "<th>Run</th><th>Accepted seq</th><th>Applied seq</th><th>Backlog</th>"
        "<th>Oldest unapplied</th><th>Mailbox</th><th>Passivated</th><th>Updated</th>"
        "</tr></thead><tbody>$rows</tbody></table>",
        rows=join(rows) if rows else render("<tr><td colspan=\"11\">No entities.</td></tr>"))
    params = {"type": chosen_type, "status": chosen_status, "key": prefix, "limit": limit,
              "refresh": None if refresh == DEFAULT_REFRESH else refresh}
    unreadable = [render("<li>$why</li>", why=why) for why in page.unreadable]
    left_out = render("<div class=\"flash error\" role=\"alert\" id=\"unreadable\">"
                      "Left out of this page, their rows do not decode:<ul>$items</ul></div>",
                      items=join(unreadable)) if unreadable else EMPTY
    return join([_filters("/", types, chosen_type, extra),
                 live(join([left_out, table, _next_link("/", params, page.next_cursor)]),
                      refresh)])


_FACTS = """<dl class="facts">
<dt>Type</dt><dd>$type</dd><dt>Key</dt><dd class="key">$key</dd>
<dt>Status</dt><dd class="status $cls" id="status">$status</dd><dt>Run</dt><dd>$run</dd>
<dt>Accepted seq</dt><dd id="accepted">$accepted</dd>
<dt>Applied seq</dt><dd id="applied">$applied</dd>
<dt>Backlog</dt><dd id="backlog">$backlog</dd><dt>Mailbox depth</dt><dd>$mailbox</dd>
<dt>Progress</dt><dd>$progress</dd><dt>Live in the dashboard's process</dt><dd>$hosted</dd>
<dt>Shard</dt><dd>$shard</dd><dt>Snapshot</dt><dd>$snapshot</dd>
<dt>Timers</dt><dd>$timers</dd><dt>Dead letters</dt><dd>$dead</dd>
</dl>"""


def entity_detail(visit: Visit, d: EntityDescription, models: Models,
                  letters: Sequence[DeadLetter], state: EntityState | None,
                  queries: list[str], refresh: int) -> Html:
    """One entity: its facts, what is in it, open waits, runs and dead letters (refreshed
    live), then the forms that act on it."""
    snapshot = "none yet" if d.snapshot_seq is None else \
        f"at seq {d.snapshot_seq}, {age(d.snapshot_age)} old"
    status = d.status.value if d.suspension is None else f"{d.status.value} (suspended)"
    facts = render(_FACTS, type=d.entity_type, key=d.key, status=status,
                   cls="suspended" if d.suspension is not None else "",
                   run=d.run_id, accepted=d.accepted_seq,
                   applied=opt(d.applied_seq), mailbox=opt(d.mailbox_depth),
                   backlog=_backlog(d), progress=_progress(d),
                   hosted="yes" if d.hosted_here else "no", shard=d.shard, snapshot=snapshot,
                   timers=", ".join(when(t) for t in d.timers) or "none", dead=d.dead_letters)
    waits = [_wait_card(visit, w, models) for w in d.open_waits]
    body = join([
        facts,
        _suspension(d),
        render("<h2>State</h2>"),
        state_panel(state),
        render("<h2>Open waits</h2>"),
        join(waits) if waits else render("<p class=\"muted\">No open waits.</p>"),
        render("<h2>Runs</h2>"),
        runs_table(d.runs),
        render("<h2>Dead letters</h2>"),
        _letters(visit, letters),
    ])
    return join([tabs(d.entity_type, d.key, "overview"), live(body, refresh),
                 actions(visit, d, queries)])


def _waited(seconds: float | None) -> str:
    return "\u2014" if seconds is None else f"{age(seconds)} ago"


def _backlog(d: EntityDescription) -> str:
    """Messages accepted and not applied yet, and how long the oldest has waited."""
    if d.backlog is None:
        return "\u2014"
    text = f"{d.backlog} message{'' if d.backlog == 1 else 's'}"
    return text if d.oldest_unapplied_age is None else \
        f"{text}, the oldest accepted {_waited(d.oldest_unapplied_age)}"


def _progress(d: EntityDescription) -> str:
    """Where the applied seq, backlog and mailbox depth come from."""
    if d.hosted_here:
        return "live, in the dashboard's process"
    if d.progress_age is None:
        return "not recorded by a host yet"
    return f"as its host recorded it {_waited(d.progress_age)}"


def _suspension(d: EntityDescription) -> Html:
    """Why a running run is suspended, and when it is retried (nothing when it is not)."""
    s = d.suspension
    if s is None:
        return render("")
    return render(
        "<div class=\"card suspension\" id=\"suspension\" role=\"alert\"><h2>Suspended</h2>"
        "<p>run() raised (or the activation could not be built): the run is kept running, "
        "its messages are kept, and it is retried. $attempts failed attempt(s) since $since; "
        "the next at $next. Deploy a fix, then resume it.</p><pre>$error</pre></div>",
        attempts=s.attempts, since=when(s.since), next=when(s.next_attempt_at), error=s.error)


def _wait_card(visit: Visit, w: SignalWaitInfo, models: Models) -> Html:
    return render(
        "<div class=\"card wait\"><p>$entity &middot; wait <strong>$name</strong> &middot; "
        "run $run &middot; waiting since $since &middot; deadline $deadline</p>$form</div>",
        entity=join([render("$t ", t=w.entity_type), _entity_link(w.entity_type, w.key)], ""),
        name=w.name, run=w.run_id, since=when(w.waiting_since),
        deadline=when(w.deadline) if w.deadline is not None else "none",
        form=deliver_form(visit, w.entity_type, w.key, w.name, w.run_id,
                          models.get((w.entity_type, w.name))))


def waits_page(visit: Visit, page: Page[SignalWaitInfo], types: Sequence[str],
               chosen_type: str | None, models: Models, refresh: int) -> Html:
    """Open signal waits, oldest first, each with a form to decide it."""
    cards = [_wait_card(visit, w, models) for w in page.items]
    return join([_filters("/waits", types, chosen_type), live(join([
        join(cards) if cards else render("<p class=\"muted\">No open waits.</p>"),
        _next_link("/waits", {"type": chosen_type}, page.next_cursor)]), refresh)])


_LETTER = """<div class="card dead-letter" id="dead-letter-$id">
<p><strong>Dead letter $id</strong> &middot; $entity &middot; signal <code>$name</code>
&middot; run $run, seq $seq &middot; $attempts attempt(s), last failed $failed</p>
<p class="muted">message id <code>$message_id</code> &middot; sender $sender</p>
<pre class="error-text">$error</pre>
<details><summary>Payload and traceback</summary><pre>$payload</pre><pre>$traceback</pre></details>
$buttons
</div>"""


def _letters(visit: Visit, letters: Sequence[DeadLetter]) -> Html:
    if not letters:
        return render("<p class=\"muted\">No dead letters.</p>")
    return join(render(_LETTER, id=x.id, name=x.name, run=x.run_id, seq=x.seq,
                       entity=join([render("$t ", t=x.entity_type),
                                    _entity_link(x.entity_type, x.key)], ""),
                       attempts=x.attempts, failed=when(x.failed_at),
                       message_id=x.message_id, sender=opt(x.sender), error=x.error,
                       payload=pretty_json(x.payload), traceback=x.traceback,
                       buttons=dead_letter_buttons(visit, x))
                for x in letters)


def dead_letters_page(visit: Visit, letters: Sequence[DeadLetter], types: Sequence[str],
                      chosen_type: str | None, limit: int, next_cursor: str | None,
                      refresh: int) -> Html:
    """Dead letters, oldest first, one page, with replay and discard."""
    params = {"type": chosen_type, "limit": limit}
    return join([_filters("/dead-letters", types, chosen_type), live(join([
        _letters(visit, letters), _next_link("/dead-letters", params, next_cursor)]), refresh)])


_OUTCOMES = {
    "delivered": "Your decision closed the wait; the run resumes with it.",
    "duplicate": "This delivery key was used before with the same decision; nothing changed.",
    "already_delivered": "Someone decided first; nothing changed. The decision that counts:",
    "stale": "The wait is closed (it timed out, or its run ended); nothing changed.",
    "buffered": "The run has not reached the wait yet; your decision is kept and wins "
                "when it does.",
    "not_waiting": "The run is not waiting yet and this type refuses early decisions; "
                   "nothing was kept.",
}

_DELIVERY = """<div class="flash">$entity &middot; wait <strong>$name</strong>:
<span class="status" id="delivery-status">$status</span>. $outcome</div>
<dl class="facts"><dt>Decided by</dt><dd id="winner">$sender</dd>
<dt>Decided at</dt><dd>$at</dd><dt>Run</dt><dd>$run</dd></dl>
<h2>Decision</h2><pre id="winner-payload">$payload</pre>"""


def delivery_result(entity_type: str, key: str, name: str, result: Delivery[BaseModel]) -> Html:
    """What a delivery did (`Delivery.status`) and the decision that counts."""
    payload = result.payload.model_dump_json(indent=2) if result.payload is not None else ""
    return render(_DELIVERY, entity=join([render("$t ", t=entity_type),
                                          _entity_link(entity_type, key)], ""),
                  name=name, status=result.status, outcome=_OUTCOMES.get(result.status, ""),
                  sender=opt(result.sender), at=when(result.delivered_at),
                  run=opt(result.run_id), payload=payload or "\u2014")


def message(text: str, *, error: bool = False, links: Sequence[tuple[str, str]] = (),
            extra: Html = EMPTY) -> Html:
    """A notice (or an error) with links on from it."""
    items = [render("<a href=\"$url\">$label</a>", url=url, label=label) for url, label in links]
    return render("<div class=\"$cls\" role=\"$role\" id=\"message\">$text</div>$extra"
                  "<p>$links</p>", cls="flash error" if error else "flash",
                  role="alert" if error else "status", text=text, extra=extra,
                  links=join(items, " &middot; "))
