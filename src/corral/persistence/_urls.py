"""Store locations as text: which name a PostgreSQL database, and how a URL is shown
without its secrets (in messages, logs, reprs and the driver's errors).

A leaf of the persistence package: `_open` (which engine to open), `_postgres` and
`_existing` all use it, and it imports none of them.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from corral._errors import InvalidArgumentError

__all__ = ["is_postgres_url", "redacted", "transaction_pooled", "url_refused"]

_POSTGRES = ("postgresql://", "postgres://")
_PARAM = re.compile(r"[?&;]([^=&;#]*)=([^&;#]*)")  # a query parameter: name, value
_SECRET_NAMES = ("pass", "secret", "token")
_DELIMITERS = re.compile(r"[/:?#@&=;%\[\]]+")


def is_postgres_url(location: str) -> bool:
    """Whether `location` names a PostgreSQL database (`postgresql://` or `postgres://`)."""
    return location.startswith(_POSTGRES)


_POOL_OPTION = "pool"
_POOL_MODES = ("transaction",)


def transaction_pooled(url: str) -> tuple[str, bool]:
    """The URL for the driver (without corral's own option), and whether it names a
    database behind a pooler in transaction mode (PgBouncer's `pool_mode = transaction`):
    `?pool=transaction`. The driver would send any other query parameter to the server
    as a setting, so corral's option is taken out.

    Raises:
        InvalidArgumentError: `pool` given twice, or with another value.

    Example:
        >>> transaction_pooled("postgresql://ana@bouncer:6432/corral?pool=transaction")
        ('postgresql://ana@bouncer:6432/corral', True)
    """
    head, mark, rest = url.partition("?")
    query, hash_, fragment = rest.partition("#")
    kept, modes = [], []
    for param in query.split("&") if mark else ():
        name, _, value = param.partition("=")
        if unquote(name) == _POOL_OPTION:
            modes.append(unquote(value))
        else:
            kept.append(param)
    if not modes:
        return url, False
    if len(modes) > 1 or modes[0] not in _POOL_MODES:
        raise InvalidArgumentError(
            f"store {redacted(url)!r}: the option `{_POOL_OPTION}` takes only "
            f"{' or '.join(_POOL_MODES)} (behind a pooler in transaction mode, such as "
            f"PgBouncer), once; got {', '.join(repr(m) for m in modes)}")
    query = "&".join(kept)
    return head + ("?" + query if query else "") + hash_ + fragment, True


def redacted(url: str) -> str:
    """The URL with every secret it may carry shown as `***`, for messages, logs and
    reprs: the password of `user:password@`, and the value of each query parameter named
    like a secret (`password`, `sslpassword`, `passfile`, any `*pass*`, `*secret*` or
    `*token*`).

    A malformed URL only loses more: the password runs to the last `@` (one in the
    password or in a query value is masked with it), and a parameter is found after
    any `?`, `&` or `;`.

    Example:
        >>> redacted("postgresql://ana:pw@db/corral?sslpassword=k")
        'postgresql://ana:***@db/corral?sslpassword=***'
    """
    spans = _secret_spans(url)
    shown, end = [], 0
    for start, stop in spans:
        shown.append(url[end:start] + "***")
        end = stop
    return "".join(shown) + url[end:]


def url_refused(url: str, err: ValueError) -> InvalidArgumentError:
    """The error for a PostgreSQL URL the driver cannot parse (asyncpg raises a
    `ValueError`: a port that is not a number, a bad IPv6 host, an unknown `sslmode`):
    bad input. The driver's message quotes pieces of the URL, so each piece of a secret
    in it is masked too."""
    detail = f"{type(err).__name__}: {err}"
    pieces = {url[a:b] for a, b in _secret_spans(url)}
    pieces |= {unquote(p) for p in pieces}
    pieces |= {part for p in pieces for part in _DELIMITERS.split(p)}
    for piece in sorted((p for p in pieces if len(p) > 1), key=len, reverse=True):
        detail = detail.replace(piece, "***")
    return InvalidArgumentError(
        f"store {redacted(url)!r} is not a PostgreSQL URL corral can use ({detail}): "
        "postgresql://user:password@host:port/database, with special characters "
        "percent-encoded")


def _secret_spans(url: str) -> list[tuple[int, int]]:
    """Where `url`'s secrets are: sorted, disjoint (start, stop) ranges."""
    head = url.find("://") + 3
    if head < 3:
        return []
    found = []
    at = url.rfind("@")
    colon = url.find(":", head, at) if at > head else -1
    if colon != -1 and colon + 1 < at:
        found.append((colon + 1, at))
    for param in _PARAM.finditer(url, head):
        name = unquote(param.group(1)).lower()
        if any(word in name for word in _SECRET_NAMES) and param.end(2) > param.start(2):
            found.append((param.start(2), param.end(2)))
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(found):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(stop, merged[-1][1]))
        else:
            merged.append((start, stop))
    return merged
