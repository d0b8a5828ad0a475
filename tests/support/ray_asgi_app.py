"""An ASGI app on corral's Ray backend, for uvicorn: `examples/webhook_ingress.py`'s
webhook endpoint, whose lifespan opens a runtime with `backend="ray"` and no address
(so it starts a Ray instance of its own) and closes it at shutdown.

    CORRAL_ASGI_STORE=/tmp/x/webhooks.db PYTHONPATH=tests/support:examples \
        python -m uvicorn --factory ray_asgi_app:build --fd 3

The lifespan prints `runtime closed` to stderr once the runtime's `async with` exited
(`tests/ray/test_ray_asgi_shutdown.py` checks it after a SIGTERM). `CORRAL_ASGI_BACKEND`
picks the backend (`ray`, the default, or `local`: the same app without Ray).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from webhook_ingress import Ticket, create_app

import corral
from webhook_traffic import SECRET

NAMESPACE = "asgi-sigterm"


@contextlib.asynccontextmanager
async def _runtime() -> AsyncIterator[corral.Runtime]:
    backend = os.environ.get("CORRAL_ASGI_BACKEND", "ray")
    async with corral.open_runtime(  # on Ray: a private instance, its release declared here
            os.environ["CORRAL_ASGI_STORE"], entities=[Ticket], shards=2, backend=backend,
            deploy=backend == "ray", namespace=NAMESPACE) as rt:
        print("runtime open", file=sys.stderr, flush=True)
        yield rt
    print("runtime closed", file=sys.stderr, flush=True)


def build() -> Starlette:
    """The app (uvicorn's `--factory`)."""
    return create_app(_runtime, secret=SECRET)
