"""The dashboard's schedules: the list (`/schedules`), one schedule's page
(`/schedules/{id}`: definition, next ticks, newest outcomes) and its writes (pause,
resume, trigger), posted with the operator's `csrf` token like every write form and
made with `sender=` the operator, so the `authorize` hook decides (kind "schedule")."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote

from corral import ScheduleInfo

from ._forms import Visit
from ._html import Html, entity_url, join, opt, render, when

__all__ = ["schedule_list", "schedule_page", "schedule_url"]

_ACTIONS = ("pause", "resume", "trigger")


def schedule_url(schedule_id: str) -> str:
    return f"/schedules/{quote(schedule_id, safe='')}"


def _spec(info: ScheduleInfo) -> str:
    spec = info.schedule.spec.model_dump(exclude={"kind"})
    return " ".join(f"{k}={v}" for k, v in spec.items())


def _row(info: ScheduleInfo) -> Html:
    a = info.schedule.action
    last = info.outcomes[0] if info.outcomes else None
    return render(
        "<tr class=\"schedule\"><td><a href=\"$url\">$id</a></td><td><a href=\"$target\">"
        "$etype $key</a></td><td>$signal</td><td>$spec</td><td>$state</td><td>$next</td>"
        "<td>$fired</td><td>$skipped</td><td>$last</td></tr>",
        url=schedule_url(info.id), id=info.id, target=entity_url(a.entity_type, a.key),
        etype=a.entity_type, key=a.key, signal=a.signal, spec=_spec(info),
        state="paused" if info.paused else "active",
        next=when(info.next_ticks[0]) if info.next_ticks else "\u2014",
        fired=info.fired, skipped=info.skipped, last=opt(last and last.outcome))


def schedule_list(infos: Sequence[ScheduleInfo], next_after: str | None) -> Html:
    """Schedules by id, one page, each with its next tick and last outcome."""
    if not infos:
        return render("<p class=\"muted\" id=\"no-schedules\">No schedules.</p>")
    more = render("<p><a href=\"/schedules?after=$after\">Next page</a></p>",
                  after=next_after) if next_after else Html("")
    return join([render(
        "<table id=\"schedules\"><thead><tr><th>Id</th><th>Target</th><th>Signal</th>"
        "<th>Spec</th><th>State</th><th>Next tick</th><th>Fired</th><th>Skipped</th>"
        "<th>Last outcome</th></tr></thead><tbody>$rows</tbody></table>",
        rows=join([_row(i) for i in infos])), more])


def _button(visit: Visit, info: ScheduleInfo, action: str) -> Html:
    return render(
        "<form method=\"post\" action=\"/schedules/$action\">"
        "<input type=\"hidden\" name=\"csrf\" value=\"$csrf\">"
        "<input type=\"hidden\" name=\"id\" value=\"$id\">"
        "<button type=\"submit\" id=\"$action\">$label</button></form>",
        action=action, csrf=visit.csrf, id=info.id, label=action.capitalize())


def schedule_page(visit: Visit, info: ScheduleInfo) -> Html:
    """One schedule: its definition, its next ticks, its newest outcomes, its actions."""
    s, a = info.schedule, info.schedule.action
    actions = [x for x in _ACTIONS if x != ("resume" if not s.paused else "pause")]
    facts = render(
        "<dl class=\"facts\"><dt>Target</dt><dd><a href=\"$target\">$etype $key</a></dd>"
        "<dt>Signal</dt><dd>$signal ($how)</dd><dt>Spec</dt><dd>$spec</dd>"
        "<dt>State</dt><dd id=\"state\">$state</dd><dt>Overlap</dt><dd>$overlap</dd>"
        "<dt>Catch-up window</dt><dd>$window s</dd><dt>Jitter</dt><dd>$jitter s</dd>"
        "<dt>Fired</dt><dd id=\"fired\">$fired</dd><dt>Skipped</dt><dd>$skipped</dd>"
        "<dt>Buffered tick</dt><dd>$buffered</dd><dt>Note</dt><dd>$note</dd></dl>",
        target=entity_url(a.entity_type, a.key), etype=a.entity_type, key=a.key,
        signal=a.signal, how="signal-with-start" if a.start is not None else "signal",
        spec=_spec(info), state="paused" if s.paused else "active", overlap=s.overlap.value,
        window=f"{s.catchup_window:g}", jitter=f"{s.jitter:g}", fired=info.fired,
        skipped=info.skipped, buffered=when(info.buffered), note=opt(s.note or None))
    ticks = join([render("<li>$t</li>", t=when(t)) for t in info.next_ticks]) \
        or render("<li class=\"muted\">none (paused or ended)</li>")
    outcomes = join([render(
        "<tr class=\"outcome $outcome\"><td>$at</td><td>$tick</td><td>$outcome</td>"
        "<td>$detail</td><td>$mid</td></tr>", at=when(o.at), tick=opt(o.tick),
        outcome=o.outcome, detail=o.detail, mid=opt(o.message_id)) for o in info.outcomes])
    return render(
        "$facts<div class=\"actions\">$actions</div><h2>Next ticks</h2>"
        "<ul id=\"next-ticks\">$ticks</ul><h2>Newest outcomes</h2><table id=\"outcomes\">"
        "<thead><tr><th>At</th><th>Tick</th><th>Outcome</th><th>Detail</th>"
        "<th>Message id</th></tr></thead><tbody>$outcomes</tbody></table>",
        facts=facts, actions=join([_button(visit, info, x) for x in actions]), ticks=ticks,
        outcomes=outcomes)
