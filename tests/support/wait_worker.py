"""Worker process for tests/runtime/test_signal_waits_processes.py:
`python wait_worker.py ROLE ...`.

Each role opens a corral runtime on the shared store (`--db`: a SQLite file or a
PostgreSQL URL, as the test's `db_path`) and reports through JSON files written
atomically, which the test reads. Roles:

- `host`: host, start `Order` `--key` (with `--timeout`, if given), and once `run()`
  has opened its approval wait (as `rt.signal_waits()` lists it) write the wait to
  `--ready`; then idle until killed.
- `deliver`: a pure client (`host=False`): report ready, wait for a go file, deliver
  the approval with its own key (`k<index>`, sender `w<index>`), then retry that key
  once; write both answers to `--out`, with when each call was made and answered.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import corral
from wait_entities import Decision, Order, OrderInput
from workers import install as install_stacks
from workers import wait_for_file, write_json

ENTITIES: list[type[corral.Entity]] = [Order]




def answer(res: corral.Delivery[Decision]) -> dict[str, Any]:
    """A `Delivery` as JSON."""
    return {"status": res.status,
            "payload": None if res.payload is None else res.payload.model_dump(),
            "sender": res.sender, "delivered_at": res.delivered_at, "run_id": res.run_id}


async def host(args: argparse.Namespace) -> None:
    async with corral.open_runtime(args.db, entities=ENTITIES, lease_ttl=args.lease_ttl) as rt:
        assert rt.host is not None
        await rt.ref(Order, args.key).start(start=OrderInput(timeout=args.timeout))
        deadline = time.monotonic() + 60
        while True:
            opened = [w for w in (await rt.signal_waits(Order)).items if w.key == args.key]
            if opened:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"run() of {args.key} never opened its wait")
            await asyncio.sleep(0.005)
        w = opened[0]
        write_json(Path(args.ready), {
            "pid": os.getpid(), "owner": rt.host.owner, "run_id": w.run_id, "name": w.name,
            "waiting_since": w.waiting_since, "deadline": w.deadline})
        await asyncio.Event().wait()  # until SIGKILLed


async def deliver(args: argparse.Namespace) -> None:
    me = f"w{args.index}"
    async with corral.open_runtime(args.db, entities=ENTITIES, host=False) as rt:
        ref = rt.ref(Order, args.key)
        write_json(Path(args.ready), {"pid": os.getpid()})
        await wait_for_file(Path(args.go))
        answers = []
        for _ in range(2):  # the delivery, then a client's retry of the same key
            sent_at = time.time()
            try:
                res = await ref.deliver(Order.approval,
                                        Decision(approved=args.index % 2 == 0, by=me),
                                        key=f"k{args.index}", sender=me)
            except Exception as err:
                answers.append({"error": repr(err)})
            else:
                answers.append(answer(res) | {"sent_at": sent_at, "answered_at": time.time()})
    write_json(Path(args.out), answers)


def main(argv: list[str]) -> None:
    install_stacks()
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="role", required=True)
    for name in ("host", "deliver"):
        p = sub.add_parser(name)
        p.add_argument("--db", required=True)
        p.add_argument("--key", required=True)
        p.add_argument("--ready", required=True)
    h = sub.choices["host"]
    h.add_argument("--lease-ttl", type=float, default=1.0)
    h.add_argument("--timeout", type=float, default=None)
    d = sub.choices["deliver"]
    d.add_argument("--index", type=int, required=True)
    d.add_argument("--go", required=True)
    d.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    asyncio.run({"host": host, "deliver": deliver}[args.role](args))


if __name__ == "__main__":
    main(sys.argv[1:])
