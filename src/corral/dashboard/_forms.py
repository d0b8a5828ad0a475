"""The dashboard's forms: deliver a decision, replay or discard a dead letter, terminate
a run, run a query, sign in.

Every write form posts the operator's hidden `csrf` token and nothing that says who
they are: the server records the authenticated operator as the sender.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from pydantic import BaseModel

from corral import DeadLetter

from ._html import Html, join, render

__all__ = ["Visit", "dead_letter_buttons", "deliver_form", "login_form", "model_hint",
           "new_delivery_key", "query_form", "terminate_form", "who"]


@dataclass(frozen=True, slots=True)
class Visit:
    """Who is looking at a page, and what their forms must carry."""

    operator: str
    csrf: str
    uses_token: bool


def new_delivery_key() -> str:
    """A fresh idempotency key for one rendering of a deliver form: submitting the same
    form twice (a double click, a reload) is answered `duplicate`, not a second decision."""
    return f"ui-{secrets.token_urlsafe(12)}"


def who(visit: Visit | None) -> Html:
    """The header's "signed in as" and, with the token, the sign-out button."""
    if visit is None:
        return Html("")
    out = render("signed in as <strong class=\"operator\">$name</strong>", name=visit.operator)
    if visit.uses_token:
        out = render("$who<form method=\"post\" action=\"/logout\">"
                     "<input type=\"hidden\" name=\"csrf\" value=\"$csrf\">"
                     "<button type=\"submit\">Sign out</button></form>",
                     who=out, csrf=visit.csrf)
    return out


def _example(model: type[BaseModel]) -> str:
    samples = {"boolean": True, "integer": 0, "number": 0.0, "string": "", "array": [],
               "object": {}}
    schema = model.model_json_schema()
    required = schema.get("required", [])
    props = schema.get("properties", {})
    return json.dumps({name: samples.get(props[name].get("type"))
                       for name in required if name in props})


def model_hint(model: type[BaseModel]) -> Html:
    """The fields a delivery takes, from the wait's model: name, JSON type, default."""
    schema = model.model_json_schema()
    required = set(schema.get("required", []))
    fields = []
    for name, prop in schema.get("properties", {}).items():
        kind = prop.get("type") or "any"
        extra = "required" if name in required else f"default {json.dumps(prop.get('default'))}"
        fields.append(render("<code>$name</code>: $kind ($extra)", name=name, kind=kind,
                             extra=extra))
    return render("<span class=\"muted\">$model: $fields</span>", model=model.__name__,
                  fields=join(fields, ", ") if fields else "no fields")


_DELIVER = """<form method="post" action="/waits/deliver" class="deliver">
<input type="hidden" name="csrf" value="$csrf">
<input type="hidden" name="entity_type" value="$entity_type">
<input type="hidden" name="key" value="$key">
<input type="hidden" name="name" value="$name">
<input type="hidden" name="run_id" value="$run_id">
<label>Decision (JSON) $hint<br>
<textarea name="payload" required placeholder="$example">$text</textarea></label><br>
<label>Delivery key <input type="text" name="delivery_key" value="$delivery_key"
 required maxlength="512"></label>
<button type="submit">Deliver</button>
</form>"""


def deliver_form(visit: Visit, entity_type: str, key: str, name: str, run_id: int | str,
                 model: type[BaseModel] | None, *, text: str = "",
                 delivery_key: str | None = None) -> Html:
    """A form that delivers a decision to one run's wait (`run_id` pins the run, so a
    page left open does not decide for the entity's next run)."""
    return render(_DELIVER, csrf=visit.csrf, entity_type=entity_type, key=key, name=name,
                  run_id=run_id, text=text, delivery_key=delivery_key or new_delivery_key(),
                  hint=model_hint(model) if model is not None else "",
                  example=_example(model) if model is not None else "{}")


_DEAD_LETTER = """<form method="post" action="/dead-letters/replay" class="replay">
<input type="hidden" name="csrf" value="$csrf">
<input type="hidden" name="entity_type" value="$entity_type">
<input type="hidden" name="key" value="$key">
<input type="hidden" name="id" value="$id">
<button type="submit" name="replay">Replay</button>
</form>
<details><summary>Discard&hellip;</summary>
<form method="post" action="/dead-letters/discard" class="discard">
<input type="hidden" name="csrf" value="$csrf">
<input type="hidden" name="entity_type" value="$entity_type">
<input type="hidden" name="key" value="$key">
<input type="hidden" name="id" value="$id">
<button type="submit" name="discard">Discard dead letter $id for good</button>
</form></details>"""


def dead_letter_buttons(visit: Visit, letter: DeadLetter) -> Html:
    """Replay (deliver it again) and, behind a second click, discard."""
    return render(_DEAD_LETTER, csrf=visit.csrf, entity_type=letter.entity_type,
                  key=letter.key, id=letter.id)


_TERMINATE = """<details class="terminate"><summary>Terminate&hellip;</summary>
<form method="post" action="/entities/terminate" class="terminate">
<input type="hidden" name="csrf" value="$csrf">
<input type="hidden" name="entity_type" value="$entity_type">
<input type="hidden" name="key" value="$key">
<label>Reason <input type="text" name="reason" maxlength="1000"></label>
<button type="submit" name="terminate">Terminate run $run_id</button>
</form></details>"""


def terminate_form(visit: Visit, entity_type: str, key: str, run_id: int) -> Html:
    """Terminate the running run, behind a second click (messages not applied yet are
    dead-lettered)."""
    return render(_TERMINATE, csrf=visit.csrf, entity_type=entity_type, key=key,
                  run_id=run_id)


_QUERY = """<form method="post" action="/entities/query" class="query">
<input type="hidden" name="csrf" value="$csrf">
<input type="hidden" name="entity_type" value="$entity_type">
<input type="hidden" name="key" value="$key">
<label>Query <select name="name">$options</select></label>
<label>Argument (JSON, if it takes one)<br>
<textarea name="payload" placeholder="{}">$text</textarea></label>
<button type="submit">Run query</button>
</form>"""


def query_form(visit: Visit, entity_type: str, key: str, names: list[str], *,
               chosen: str = "", text: str = "") -> Html:
    """Run one of the type's query handlers (it changes nothing)."""
    options = join([render("<option value=\"$n\"$sel>$n</option>", n=n,
                           sel=Html(" selected") if n == chosen else "") for n in names], "")
    return render(_QUERY, csrf=visit.csrf, entity_type=entity_type, key=key,
                  options=options, text=text)


_LOGIN = """<form method="post" action="/login" class="card">
<input type="hidden" name="next" value="$next">
<p>Sign in with the token <code>corral ui</code> printed when it started.</p>
<label>Token <input type="password" name="token" autocomplete="current-password"
 autofocus required></label>
<button type="submit">Sign in</button>
</form>"""


def login_form(next_path: str) -> Html:
    """The token sign-in form; `next_path` is where to go afterwards."""
    return render(_LOGIN, next=next_path)
