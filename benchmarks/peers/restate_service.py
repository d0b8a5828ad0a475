"""The Restate side of the benchmark: a VirtualObject per entity, served by hypercorn.

Run by `_servers.start_restate` as `hypercorn restate_service:app` in the restate venv.
`ping` counts in the object's durable state (and tells the driver by datagram when the
payload asks, for W5); `count` is a shared (read-only) handler.
"""

from __future__ import annotations

import socket
from typing import Any

import restate

counter = restate.VirtualObject("Counter")


@counter.handler()
async def ping(ctx: restate.ObjectContext, arg: dict[str, Any]) -> None:
    count = await ctx.get("count", type_hint=int) or 0
    ctx.set("count", count + 1)
    if arg.get("port"):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(f"{ctx.key()}|{arg['n']}".encode(), ("127.0.0.1", arg["port"]))


@counter.handler(kind="shared")
async def count(ctx: restate.ObjectSharedContext) -> int:
    return await ctx.get("count", type_hint=int) or 0


app = restate.app([counter])
