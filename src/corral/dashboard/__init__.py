"""The operator's web dashboard: entities (searched by key prefix), one entity's state
and history, open waits and dead letters, over HTTP.

`create_app(runtime, ...)` is the ASGI app (Starlette) on an open runtime; `run(store,
app, ...)` serves it with uvicorn, which is what `corral ui` does. Plain HTML forms;
one small script of its own (`/live.js`, `_live`) refreshes lists and entity pages in
place; nothing is loaded from elsewhere and nothing is built.

Layering: the dashboard sits on top and uses only the public client API, exactly as an
application would (`Runtime.entities`, `signal_waits`, `dead_letters`,
`EntityRef.describe`, `state`, `history`, `query`, `deliver`, `terminate`,
`replay_dead_letter`, `discard_dead_letter`); it never reaches the host or the store.
Every read, write and query carries the authenticated operator as its `sender` (never
what a form claims), so the application's `authorize` hook decides on it as on any
other caller (a read as kind "read": refused, the page is a 403), and each form post
must carry the operator's CSRF token and come from this site.

Example:
    import corral, corral.dashboard
    corral.dashboard.run("corral.db", corral.App(entities=[Order]))   # prints URL, token
"""

from ._routes import create_app
from ._serve import run

__all__ = ["create_app", "run"]
