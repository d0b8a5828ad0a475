"""The webhook ingress example as a Ray Serve application: two replicas of the same
Starlette app, each calling `signal_with_start` through corral's Ray backend, over real
HTTP through Serve's proxy on 127.0.0.1.

It uses the session's Ray instance (`ray_address`), starts Serve on a free port, and
shuts Serve down and stops its corral shard actors afterwards, so the other Ray tests
see neither.
"""

from __future__ import annotations

import socket
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic.warnings import PydanticDeprecatedSince20

import corral
from webhook_traffic import (
    RUNTIME_ENV,
    SECRET,
    applied_by_ticket,
    burst,
    check_burst,
    load_example,
    post_all,
)

REPLICAS = 2
SHARDS = 2  # several shard actors on one store, as deployed; few on 2 cores


def import_serve() -> Any:
    """`ray.serve`, imported without the deprecation warnings of its own pydantic models
    (Ray 2.60 declares `Field(update_type=...)`, which pydantic 2 deprecates), which
    `filterwarnings = error` would turn into an import error."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PydanticDeprecatedSince20)
        from ray import serve
    return serve


@dataclass(frozen=True)
class Ingress:
    url: str
    store: str
    namespace: str


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return load_example()


@pytest.fixture
def ingress(ray_address: str, example: ModuleType, tmp_path: Path) -> Iterator[Ingress]:
    """The example deployed on Serve (two replicas) in front of a deployment of its own,
    declared first as `corral deploy` would: the replicas are clients of it."""
    serve = import_serve()
    with socket.socket() as probe:  # Serve binds the port itself: ask the kernel for one
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store, namespace = str(tmp_path / "tickets.db"), f"wh-{uuid.uuid4().hex[:8]}"
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        corral.runtime.deploy(namespace, app="webhook_ingress:Ticket", store=store,
                              runtime_env=RUNTIME_ENV, shards=SHARDS)
        app = example.serve_deployment(
            store, secret=SECRET, namespace=namespace, shards=SHARDS, replicas=REPLICAS,
            runtime_env=RUNTIME_ENV,
            # Nothing is in flight at teardown: skip Serve's 2 s drain loop (shutdown 3 s -> 1 s).
            graceful_shutdown_wait_loop_s=0.1, graceful_shutdown_timeout_s=2)
        serve.run(app, name="webhooks", route_prefix="/")
        yield Ingress(f"http://127.0.0.1:{port}", store, namespace)
    finally:
        serve.shutdown()
        corral.runtime.stop_ray_hosts(namespace)


async def test_two_serve_replicas_apply_each_of_200_concurrent_webhooks_once(
    example: ModuleType, ingress: Ingress,
) -> None:
    deliveries = burst(example, posts=200, tickets=20, distinct=120, forged=10, invalid=10)
    replies = await post_all(ingress.url, deliveries)
    tickets = {d.ticket for d in deliveries if d.expect == 200}
    async with corral.open_runtime(ingress.store, entities=[example.Ticket], backend="ray",
                                   namespace=ingress.namespace, shards=SHARDS) as rt:
        applied = await applied_by_ticket(rt, example, tickets)
    check_burst(deliveries, replies, applied, ingress.store)
    served_by = {r.headers.get("X-Served-By") for r in replies}
    assert len(served_by) == REPLICAS, served_by  # both replicas took part
