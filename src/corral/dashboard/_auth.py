"""Who the operator is, and which form posts are theirs.

Either the application's `authenticate(request)` names the operator (None refuses), or
the dashboard's bearer token does: `Authorization: Bearer <token>`, or the HttpOnly,
SameSite=Strict cookie that signing in with it sets; its operator is `TOKEN_OPERATOR`.
The token is compared in constant time and never written into a page.

Every POST must come from a page of this dashboard: its `Origin` (or, without one, its
`Referer`) must name this host, and its hidden `csrf` field must be the token of the
signed-in operator, an HMAC of their name under a key drawn when the app is created
(so forms go stale when the dashboard restarts, and a token is useless to anyone else).
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import secrets
from collections.abc import Awaitable, Callable, Mapping
from urllib.parse import urlsplit

from starlette.requests import Request

__all__ = ["COOKIE", "TOKEN_OPERATOR", "Authenticate", "Gate", "Refused", "check_origin",
           "check_token", "safe_next"]

COOKIE = "corral_dashboard"
"""The session cookie, holding the bearer token (HttpOnly, SameSite=Strict)."""

TOKEN_OPERATOR = "dashboard"
"""The operator recorded for writes made by someone who signed in with the token."""

Authenticate = Callable[[Request], "str | Awaitable[str | None] | None"]
"""The application's hook: the operator's name for a request, or None to refuse it."""


class Refused(Exception):
    """A request the dashboard will not serve; `status` is its HTTP status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Gate:
    """Authentication and CSRF checks of one dashboard app."""

    def __init__(self, authenticate: Authenticate | None, token: str | None) -> None:
        if (authenticate is None) == (token is None):
            raise ValueError("the dashboard needs exactly one of authenticate= (the "
                             "application decides who the operator is) or token=")
        if token is not None:
            check_token(token)
        self._authenticate = authenticate
        self._token = token
        self._key = secrets.token_bytes(32)

    @property
    def uses_token(self) -> bool:
        """Whether operators sign in with the bearer token (and sign out again)."""
        return self._token is not None

    async def operator(self, request: Request) -> str | None:
        """The signed-in operator's name, or None (then the request gets a 401)."""
        if self._authenticate is not None:
            found = self._authenticate(request)
            if inspect.isawaitable(found):
                found = await found
            if found is not None and not isinstance(found, str):
                raise TypeError(f"authenticate must return the operator's name (str) or "
                                f"None, got {found!r}")
            return found or None
        scheme, _, credential = request.headers.get("authorization", "").partition(" ")
        presented = credential.strip() if scheme.lower() == "bearer" else \
            request.cookies.get(COOKIE)
        return TOKEN_OPERATOR if presented is not None and self.is_token(presented) else None

    def is_token(self, presented: str) -> bool:
        """Whether `presented` is the dashboard's token (constant time)."""
        if self._token is None:
            return False
        return hmac.compare_digest(presented.encode("utf-8", "surrogatepass"),
                                   self._token.encode())

    def csrf(self, operator: str) -> str:
        """The hidden form token of `operator`'s pages."""
        mac = hmac.new(self._key, operator.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return mac.hexdigest()

    def check_post(self, request: Request, form: Mapping[str, str], operator: str) -> None:
        """Refuse (403) a form post that did not come from this operator's page."""
        check_origin(request)
        if not hmac.compare_digest(form.get("csrf", "").encode("utf-8", "surrogatepass"),
                                   self.csrf(operator).encode()):
            raise Refused("This form did not come from a page of this dashboard (or it was "
                          "shown before the dashboard restarted): reload the page and try "
                          "again. Nothing was changed.", 403)


def check_token(token: object) -> None:
    """Refuse (`ValueError`) a token that is easy to guess or cannot be sent in a header."""
    if not isinstance(token, str) or len(token) < 16 or not token.isascii() \
            or not token.isprintable() or token != token.strip() or " " in token:
        raise ValueError("the dashboard's token must be at least 16 printable ASCII "
                         "characters without spaces (secrets.token_urlsafe() makes one)")


def check_origin(request: Request) -> None:
    """Refuse (403) a post whose `Origin` (or `Referer`) names another site.

    Only host and port are compared, so a TLS-terminating proxy that keeps `Host` works.
    A request without either header (a script) passes this check; the form token must
    still match.
    """
    claimed = request.headers.get("origin") or request.headers.get("referer")
    if claimed is None:
        return
    host = request.headers.get("host", "")
    if claimed == "null" or urlsplit(claimed).netloc.lower() != host.lower():
        raise Refused(f"This post came from another site ({claimed[:100]}), not from "
                      f"this dashboard. Nothing was changed.", 403)


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path on this site, never another site."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    return target
