"""The dashboard's Starlette app: its routes, the operator on every page, errors as pages.

Reads go through `Runtime.entities`, `signal_waits`, `dead_letters`, `schedules` and
`EntityRef.describe`, `state`, `history`, `dead_letters`; writes (and queries) through
`EntityRef.deliver`, `terminate`, `query`, `replay_dead_letter` and
`discard_dead_letter`, always with `sender=` the authenticated operator (whatever a
form says), so the application's `authorize` hook decides on them as on any caller's
(a read as kind "read"; a refusal is a 403 page).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, cast
from urllib.parse import quote

from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from pydantic_core import to_jsonable_python
from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import corral
import corral.dashboard._entity_page as entity
import corral.dashboard._schedule_pages as schedules
import corral.dashboard._views as views
from corral import (
    CorralError,
    CorruptRowError,
    DeadLetterNotFoundError,
    EntityClosedError,
    EntityNotRunningError,
    IdempotencyConflictError,
    PayloadTooLargeError,
    RunStatus,
    Runtime,
    ScheduleNotFoundError,
    SignalWait,
    StoreError,
    UnauthorizedError,
    UnknownEntityTypeError,
    UnknownHandlerError,
)
from corral._scrape import census_text
from corral.actors import HandlerKind
from corral.metrics import REGISTRY, exposition, merge

from ._auth import COOKIE, Authenticate, Gate, Refused, check_origin, safe_next
from ._forms import Visit, deliver_form, login_form, query_form, who
from ._html import EMPTY, STYLE, Html, entity_url, join, layout, render
from ._live import LIVE_JS, live, refresh_period

__all__ = ["create_app"]

MAX_FORM_BYTES = 1 << 20
"""The largest form post (a decision is at most `Limits.max_payload_bytes`, 256 KiB)."""
MAX_PAGE = 1000
"""The most rows one page lists."""

_HEADERS = {  # on every response (`_SecurityHeaders`), unless the route set its own
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; script-src 'self'; "
                               "connect-src 'self'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

_STATUS: tuple[tuple[type[CorralError], int], ...] = (
    (UnauthorizedError, 403),
    (UnknownEntityTypeError, 404),
    (UnknownHandlerError, 404),
    (DeadLetterNotFoundError, 404),
    (ScheduleNotFoundError, 404),
    (IdempotencyConflictError, 409),
    (EntityNotRunningError, 409),
    (EntityClosedError, 409),
    (PayloadTooLargeError, 413),
    (CorruptRowError, 422),  # a stored row does not decode: no retry helps, nor a fix here
    (StoreError, 503),  # the store, not the request: retrying may work
)

Get = Callable[[Request, Visit], Awaitable[Response]]
Post = Callable[[Request, Visit, dict[str, str]], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]


def status_of(err: CorralError) -> int:
    """The HTTP status of a page showing `err`: 4xx for the request's fault."""
    return next((code for kind, code in _STATUS if isinstance(err, kind)), 400)


def _int(text: str | None, what: str) -> int | None:
    """A decimal from a form or query (None when empty); 400 for anything else."""
    if not text:
        return None
    if not (text.isascii() and text.isdecimal() and len(text) <= 19):
        raise Refused(f"{what} must be a whole number, got {text[:40]!r}", 400)
    return int(text)


def _limit(text: str | None, default: int) -> int:
    """A page size from the query: `default` when empty, at most `MAX_PAGE` (400 beyond)."""
    limit = _int(text, "limit") or default
    if limit > MAX_PAGE:
        raise Refused(f"limit is at most {MAX_PAGE}", 400)
    return limit


async def _form(request: Request) -> dict[str, str]:
    """A urlencoded form post of bounded size (411, 413, 415 otherwise)."""
    length = request.headers.get("content-length", "")
    if not (length.isascii() and length.isdecimal()):
        raise Refused("A form post needs a Content-Length.", 411)
    if int(length) > MAX_FORM_BYTES:
        raise Refused(f"A form post is at most {MAX_FORM_BYTES} bytes.", 413)
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise Refused("Forms are posted as application/x-www-form-urlencoded.", 415)
    async with request.form(max_files=0, max_fields=32) as form:
        return {k: v for k, v in form.items() if isinstance(v, str)}


def _metrics_route(runtime: Runtime) -> Route:
    """`/metrics`: the deployment's census from the store (`corral._scrape`, the same on
    every backend), then this process's own series (`corral.metrics.REGISTRY`) with, on
    Ray, every host actor's (`Runtime.host_metrics`, labelled `host`)."""

    async def metrics(request: Request) -> Response:
        series = merge(REGISTRY.collect(), await runtime.host_metrics())
        body = await census_text(runtime.census) + exposition(series)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return Route("/metrics", metrics, methods=["GET"])


class _Dashboard:
    """The pages of one runtime."""

    def __init__(self, runtime: Runtime, gate: Gate) -> None:
        self.rt = runtime
        self.gate = gate
        definitions = runtime.boundary.definitions
        self.types = sorted(definitions)
        self.waits: dict[tuple[str, str], Any] = {}  # SignalWait, as deliver takes it
        for name, definition in definitions.items():
            for klass in reversed(definition.cls.__mro__):  # a subclass's own wins
                for value in vars(klass).values():
                    if isinstance(value, SignalWait) and value.belongs_to(definition.cls):
                        self.waits[(name, value.name)] = value
        self.models: dict[tuple[str, str], type[BaseModel]] = {
            k: cast("type[BaseModel]", w.model) for k, w in self.waits.items()}
        self.queries: dict[str, list[str]] = {
            name: sorted(n for n, h in d.handlers.items() if h.kind is HandlerKind.QUERY)
            for name, d in definitions.items()}

    def routes(self) -> list[BaseRoute]:
        routes: list[BaseRoute] = [
            Route("/healthz", _healthz, methods=["GET"]),
            Route("/style.css", _style, methods=["GET"]),
            Route("/live.js", _live_js, methods=["GET"]),
            Route("/", self._get(self.entity_list), methods=["GET"]),
            Route("/entities/terminate", self._post(self.terminate), methods=["POST"]),
            Route("/entities/query", self._post(self.query), methods=["POST"]),
            Route("/entities/{entity_type}/{key:path}", self._get(self.entity_detail),
                  methods=["GET"]),
            Route("/waits", self._get(self.wait_list), methods=["GET"]),
            Route("/waits/deliver", self._post(self.deliver), methods=["POST"]),
            Route("/dead-letters", self._get(self.dead_letter_list), methods=["GET"]),
            Route("/dead-letters/replay", self._post(self.replay), methods=["POST"]),
            Route("/dead-letters/discard", self._post(self.discard), methods=["POST"]),
            Route("/schedules", self._get(self.schedule_list), methods=["GET"]),
            Route("/schedules/{action:str}", self._post(self.schedule_write),
                  methods=["POST"]),
            Route("/schedules/{schedule_id:path}", self._get(self.schedule_detail),
                  methods=["GET"]),
        ]
        if self.gate.uses_token:
            routes += [Route("/login", self.login_page, methods=["GET"]),
                       Route("/login", self.login, methods=["POST"]),
                       Route("/logout", self._post(self.logout), methods=["POST"])]
        return routes

    # -- plumbing ------------------------------------------------------------------------

    def _page(self, title: str, body: Html, visit: Visit | None, status: int = 200,
              headers: dict[str, str] | None = None) -> HTMLResponse:
        return HTMLResponse(layout(title, body, who(visit)), status_code=status,
                            headers=headers)

    def _error(self, visit: Visit | None, err: Exception, extra: Html = EMPTY) -> Response:
        if isinstance(err, Refused):
            return self._page("Refused", views.message(str(err), error=True), visit, err.status)
        assert isinstance(err, CorralError)
        text = f"{type(err).__name__}: {err}"
        return self._page("Error", views.message(text, error=True, extra=extra,
                                                 links=[("/", "Entities")]),
                          visit, status_of(err))

    def _unauthorized(self, request: Request) -> Response:
        if self.gate.uses_token:
            # The decoded path, encoded again: a key may hold `#` or `?`.
            target = quote(request.scope["path"], safe="/") + \
                (f"?{request.url.query}" if request.url.query else "")
            body = join([views.message("Sign in to use the dashboard.", error=True),
                         login_form(safe_next(target))])
        else:
            body = views.message("You are not signed in (the application's authenticate "
                                 "hook did not recognise this request).", error=True)
        challenge = {"WWW-Authenticate": 'Bearer realm="corral"'} if self.gate.uses_token \
            else {}
        return self._page("Sign in", body, None, 401, challenge)

    async def _visit(self, request: Request) -> Visit | None:
        operator = await self.gate.operator(request)
        if operator is None:
            return None
        return Visit(operator, self.gate.csrf(operator), self.gate.uses_token)

    def _get(self, endpoint: Get) -> Endpoint:
        async def serve(request: Request) -> Response:
            visit = await self._visit(request)
            if visit is None:
                return self._unauthorized(request)
            try:
                return await endpoint(request, visit)
            except (CorralError, Refused) as err:
                return self._error(visit, err)
        return serve

    def _post(self, endpoint: Post) -> Endpoint:
        async def serve(request: Request) -> Response:
            visit = await self._visit(request)
            if visit is None:
                return self._unauthorized(request)
            try:
                form = await _form(request)
                self.gate.check_post(request, form, visit.operator)
                return await endpoint(request, visit, form)
            except (CorralError, Refused) as err:
                return self._error(visit, err)
        return serve

    def _ref(self, entity_type: str, key: str) -> corral.EntityRef[corral.Entity, Any]:
        definition = self.rt.boundary.definition(entity_type)
        cls = cast("type[corral.Entity]", definition.cls)
        return self.rt.ref(cls, key)

    # -- pages ---------------------------------------------------------------------------

    async def entity_list(self, request: Request, visit: Visit) -> Response:
        q = request.query_params
        etype, status = q.get("type") or None, q.get("status") or None
        prefix = q.get("key") or None
        limit = _limit(q.get("limit"), 50)
        page = await self.rt.entities(etype, status=status, limit=limit,
                                      after=q.get("after") or None, key_prefix=prefix,
                                      sender=visit.operator)
        body = views.entity_list(page, self.types, etype, status, limit, prefix,
                                 refresh_period(q.get("refresh")))
        return self._page("Entities", body, visit)

    async def entity_detail(self, request: Request, visit: Visit) -> Response:
        ref = self._ref(request.path_params["entity_type"], request.path_params["key"])
        q = request.query_params
        refresh, after = refresh_period(q.get("refresh")), q.get("after") or None
        title = f"{ref.definition.name} {ref.key}"
        if q.get("view") == "history":
            found = await ref.history(limit=_limit(q.get("limit"), 100), after=after,
                                      sender=visit.operator)
            body = join([entity.tabs(ref.definition.name, ref.key, "history"),
                         live(entity.history_view(found), refresh)])
            return self._page(f"{title} \u00b7 history", body, visit)
        described = await ref.describe(sender=visit.operator)
        letters = await ref.dead_letters(sender=visit.operator) \
            if described.dead_letters else []
        state = None if described.status is RunStatus.NEVER_STARTED else \
            await ref.state(limit=_limit(q.get("limit"), 20), after=after,
                            sender=visit.operator)
        body = views.entity_detail(visit, described, self.models, letters, state,
                                   self.queries.get(ref.definition.name, []), refresh)
        return self._page(title, body, visit)

    async def wait_list(self, request: Request, visit: Visit) -> Response:
        q = request.query_params
        etype = q.get("type") or None
        page = await self.rt.signal_waits(etype, limit=100, after=q.get("after") or None,
                                          sender=visit.operator)
        waiting = sorted({t for t, _ in self.waits})
        body = views.waits_page(visit, page, waiting, etype, self.models,
                                refresh_period(q.get("refresh")))
        return self._page("Open waits", body, visit)

    async def dead_letter_list(self, request: Request, visit: Visit) -> Response:
        q = request.query_params
        etype = q.get("type") or None
        limit = _limit(q.get("limit"), 100)
        # One more than a page says whether there is a next one; ids are the cursor.
        letters = await self.rt.dead_letters(etype, limit=limit + 1,
                                             after=_int(q.get("after"), "after"),
                                             sender=visit.operator)
        cursor = str(letters[limit - 1].id) if len(letters) > limit else None
        body = views.dead_letters_page(visit, letters[:limit], self.types, etype, limit, cursor,
                                       refresh_period(q.get("refresh")))
        return self._page("Dead letters", body, visit)

    async def schedule_list(self, request: Request, visit: Visit) -> Response:
        q = request.query_params
        limit = _limit(q.get("limit"), 100)
        infos = await self.rt.schedules.list(after=q.get("after") or "", limit=limit + 1,
                                             sender=visit.operator)
        more = infos[limit - 1].id if len(infos) > limit else None
        return self._page("Schedules", schedules.schedule_list(infos[:limit], more), visit)

    async def schedule_detail(self, request: Request, visit: Visit) -> Response:
        sid = request.path_params["schedule_id"]
        info = await self.rt.schedules.describe(sid, sender=visit.operator)
        return self._page(f"Schedule {sid}", schedules.schedule_page(visit, info), visit)

    # -- writes --------------------------------------------------------------------------

    async def schedule_write(self, request: Request, visit: Visit, form: dict[str, str]
                             ) -> Response:
        """Pause, resume or trigger a schedule, as the operator."""
        action, sid = request.path_params["action"], form.get("id", "")
        if action not in ("pause", "resume", "trigger"):
            raise Refused(f"no schedule action {action[:40]!r}", 404)
        done = await getattr(self.rt.schedules, action)(sid, sender=visit.operator)
        text = f"Schedule {sid}: {action}d." if action != "trigger" else \
            f"Schedule {sid} triggered: {', '.join(done.outcomes)}."
        return self._page(action.capitalize(), views.message(text, links=[
            (schedules.schedule_url(sid), f"Schedule {sid}"), ("/schedules", "Schedules")]),
            visit)

    async def deliver(self, request: Request, visit: Visit, form: dict[str, str]) -> Response:
        ref = self._ref(form.get("entity_type", ""), form.get("key", ""))
        etype, name = ref.definition.name, form.get("name", "")
        declared = ref.definition.wait(name)  # an old name (`renamed_from=`) finds it too
        wait = None if declared is None else self.waits.get((etype, declared.name))
        if wait is None:
            raise UnknownHandlerError(f"{etype} has no wait {name!r}", entity_type=etype)
        run_id, text = _int(form.get("run_id"), "run id"), form.get("payload", "")
        key = form.get("delivery_key", "")
        again = render("<h2>Try again</h2>$form", form=deliver_form(
            visit, etype, ref.key, name, run_id or "", wait.model, text=text, delivery_key=key))
        try:
            payload = json.loads(text)
        except (ValueError, RecursionError) as err:
            body = views.message(f"The decision is not JSON ({err}). Nothing was delivered.",
                                 error=True, extra=again)
            return self._page("Not delivered", body, visit, 400)
        try:
            result = await ref.deliver(wait, payload, key=key, sender=visit.operator,
                                       run_id=run_id)
        except CorralError as err:
            return self._error(visit, err, again)
        body = views.delivery_result(etype, ref.key, name, result)
        return self._page(f"Delivery {result.status}", body, visit)

    async def replay(self, request: Request, visit: Visit, form: dict[str, str]) -> Response:
        ref = self._ref(form.get("entity_type", ""), form.get("key", ""))
        ident = _int(form.get("id"), "dead letter id") or 0
        ack = await ref.replay_dead_letter(ident, sender=visit.operator)
        text = (f"Dead letter {ident} replayed ({ack.status}): signal seq {ack.seq} of run "
                f"{ack.run_id}.")
        return self._page("Replayed", self._done(text, ref), visit)

    async def discard(self, request: Request, visit: Visit, form: dict[str, str]) -> Response:
        ref = self._ref(form.get("entity_type", ""), form.get("key", ""))
        ident = _int(form.get("id"), "dead letter id") or 0
        gone = await ref.discard_dead_letter(ident, sender=visit.operator)
        text = f"Dead letter {ident} discarded." if gone else \
            f"Dead letter {ident} was already gone; nothing changed."
        return self._page("Discarded", self._done(text, ref), visit)

    async def terminate(self, request: Request, visit: Visit, form: dict[str, str]
                        ) -> Response:
        ref = self._ref(form.get("entity_type", ""), form.get("key", ""))
        ack = await ref.terminate(form.get("reason", ""), sender=visit.operator)
        text = f"Run {ack.run_id} of {ref.definition.name} {ref.key} terminated ({ack.status})."
        return self._page("Terminated", views.message(text, links=[
            (entity_url(ref.definition.name, ref.key), f"{ref.definition.name} {ref.key}"),
            ("/", "Entities")]), visit)

    async def query(self, request: Request, visit: Visit, form: dict[str, str]) -> Response:
        ref = self._ref(form.get("entity_type", ""), form.get("key", ""))
        etype, name, text = ref.definition.name, form.get("name", ""), form.get("payload", "")
        if name not in self.queries.get(etype, []):
            raise UnknownHandlerError(f"{etype} has no query {name!r}", entity_type=etype)
        again = render("<h2>Try again</h2>$form", form=query_form(
            visit, etype, ref.key, self.queries[etype], chosen=name, text=text))
        try:
            payload = json.loads(text) if text.strip() else None
        except (ValueError, RecursionError) as err:
            body = views.message(f"The argument is not JSON ({err}).", error=True, extra=again)
            return self._page("Not queried", body, visit, 400)
        try:
            result = await ref.query(getattr(ref.definition.cls, name), payload,
                                     sender=visit.operator)
        except CorralError as err:
            return self._error(visit, err, again)
        body = entity.query_result(etype, ref.key, name,
                                   to_jsonable_python(result, by_alias=True))
        return self._page(f"Query {name}", body, visit)

    def _done(self, text: str, ref: corral.EntityRef[Any, Any]) -> Html:
        return views.message(text, links=[
            (entity_url(ref.definition.name, ref.key), f"{ref.definition.name} {ref.key}"),
            ("/dead-letters", "Dead letters")])

    # -- signing in with the token -----------------------------------------------------

    async def login_page(self, request: Request) -> Response:
        token = request.query_params.get("token")
        if token is not None:  # the link `corral ui` prints: sign in, then drop the token
            return self._signed_in(request, token, "/")
        if await self.gate.operator(request) is not None:
            return RedirectResponse(safe_next(request.query_params.get("next")), 303)
        return self._page("Sign in", login_form(safe_next(request.query_params.get("next"))),
                          None)

    async def login(self, request: Request) -> Response:
        try:
            check_origin(request)
            form = await _form(request)
        except Refused as err:
            return self._error(None, err)
        return self._signed_in(request, form.get("token", ""), safe_next(form.get("next")))

    def _signed_in(self, request: Request, token: str, target: str) -> Response:
        if not self.gate.is_token(token):
            body = join([views.message("That is not the dashboard's token.", error=True),
                         login_form(target)])
            return self._page("Sign in", body, None, 401)
        response = RedirectResponse(target, 303, headers={"Referrer-Policy": "no-referrer"})
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/",
                            secure=request.url.scheme == "https")
        return response

    async def logout(self, request: Request, visit: Visit, form: dict[str, str]) -> Response:
        response = RedirectResponse("/login", 303)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response


async def _healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


async def _live_js(request: Request) -> Response:
    return Response(LIVE_JS, media_type="text/javascript",
                    headers={"Cache-Control": "max-age=3600"})


async def _style(request: Request) -> Response:
    return Response(STYLE, media_type="text/css", headers={"Cache-Control": "max-age=3600"})


def create_app(runtime: Runtime, *, authenticate: Authenticate | None = None,
               token: str | None = None) -> Starlette:
    """The dashboard as an ASGI app (Starlette) on an open runtime.

    Args:
        runtime: the runtime it reads and writes through (typically `host=False`).
        authenticate: the application's hook: given the request, the operator's name, or
            None to answer 401. Without it, `token` decides.
        token: the bearer token operators sign in with (`Authorization: Bearer`, or the
            sign-in form, which sets an HttpOnly cookie); their sender is `"dashboard"`.

    Every read and write is made with `sender=` the operator, so the runtime's
    `authorize` hook sees who it was (reads as kind "read"). `/healthz` and `/metrics`
    (Prometheus: the deployment's census from the store, then this process's own
    series) answer without signing in.

    Example:
        async with corral.open_runtime("corral.db", entities=[Order], host=False) as rt:
            app = corral.dashboard.create_app(rt, token=secrets.token_urlsafe())
            await uvicorn.Server(uvicorn.Config(app, port=8765)).serve()
    """
    dashboard = _Dashboard(runtime, Gate(authenticate, token))
    routes = dashboard.routes()
    routes.append(_metrics_route(runtime))
    return Starlette(routes=routes, middleware=[Middleware(_SecurityHeaders)])


class _SecurityHeaders:
    """ASGI middleware: every response carries `_HEADERS` (a header the route set stays),
    Starlette's own 404 and 405 included, and a 500 of its own for an exception no
    route caught (Starlette's error middleware, outside this one, would send a bare one;
    it still logs the exception)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_headed(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = MutableHeaders(scope=message)
                for name, value in _HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        try:
            await self.app(scope, receive, send_headed)
        except Exception:
            if not started:
                await PlainTextResponse("Internal Server Error", 500)(scope, receive,
                                                                      send_headed)
            raise
