"""A Ray driver with a private Ray instance (`address=None`), for the test of two
drivers on one store (`tests/ray/test_ray_env.py`).

    python ray_hosting_driver.py first|second --store PATH --dir DIR

Both open `open_runtime(PATH, backend="ray", deploy=True)` without an address: each
starts its own Ray instance and declares its release there, as two single-process
apps would. They step through files in DIR (`<name>` written by the test,
`<role>-<name>` by the driver) and write `<role>.json`:

* first: opens (its hosts start and claim the store), reports `opened`, waits `go1`,
  sends `HALF` signals, reports `sent1`, waits `go2`, sends `HALF` more, reads every
  key back and writes the acks and what each entity applied.
* second: waits `try` (its Ray instance up), opens (refused: its deploy checks the
  store's claim before anything starts), and writes the error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import corral
from ray_workers import RUNTIME_ENV, Counter, Item, Seen, Start, wait_for_file

HALF = 30
KEYS = [f"ticket-{i}" for i in range(6)]
NAMESPACE = "two-drivers"


def _open(store: str) -> Any:
    return corral.open_runtime(store, entities=[Counter], backend="ray", deploy=True, shards=4,
                               namespace=NAMESPACE, env_vars=RUNTIME_ENV["env_vars"])


async def _send(rt: corral.Runtime, who: str, numbers: range) -> list[str]:
    acks = await asyncio.gather(*(
        rt.ref(Counter, KEYS[n % len(KEYS)]).signal_with_start(
            Counter.add, Item(id=f"{who}-{n}"), start=Start(tenant=who),
            message_id=f"{who}-{n}") for n in numbers))
    return [a.status for a in acks]


def _step(folder: Path, role: str, done: str, wait: str) -> None:
    (folder / f"{role}-{done}").write_text("")
    wait_for_file(folder / wait, timeout=240)


async def first(store: str, folder: Path) -> dict[str, Any]:
    async with _open(store) as rt:
        await asyncio.to_thread(_step, folder, "first", "opened", "go1")
        statuses = await _send(rt, "first", range(HALF))
        await asyncio.to_thread(_step, folder, "first", "sent1", "go2")
        statuses += await _send(rt, "first", range(HALF, 2 * HALF))
        applied = {}
        for key in KEYS:
            seen: Seen = await rt.ref(Counter, key).query(Counter.seen)
            applied[key] = seen.items
        import ray

        ctx = ray.get_runtime_context()
        address, session = ctx.gcs_address, ctx.get_session_name()
    return {"statuses": statuses, "applied": applied, "address": address,
            "session": session}


def _error(err: BaseException) -> dict[str, Any]:
    return {"type": type(err).__name__, "message": str(err),
            "holder": getattr(err, "holder", None), "cluster": getattr(err, "cluster", None),
            "address": getattr(err, "address", None)}


async def second(store: str, folder: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    await asyncio.to_thread(_step, folder, "second", "started", "try")
    try:
        async with _open(store) as rt:  # the deploy's check refuses
            out["opened"] = True
            out["statuses"] = await _send(rt, "second", range(1))
    except Exception as err:
        out["on_open"] = _error(err)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["first", "second"])
    parser.add_argument("--store", required=True)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    folder = Path(args.dir)
    run = first if args.role == "first" else second
    result = asyncio.run(run(args.store, folder))
    (folder / f"{args.role}.json").write_text(json.dumps(result))
    sys.exit(0)


if __name__ == "__main__":
    main()
