"""Worker process for tests/runtime/test_signal_many.py:
`python batch_worker.py ROLE --db STORE --fire FILE --out FILE --keys N`.

A pure client (`host=False`) that waits for the fire file, then sends one signal to
each of `--keys` `Counter` entities (`key-<n>`, message id `id-<n>`, the same payload
and start input in every process), and writes each answer's status as JSON. Roles:

- `batch`: all of them in one `signal_many` call.
- `singles`: one `signal_with_start` each, all at once.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import corral
from ray_workers import Counter, Item, Start
from workers import install as install_stacks
from workers import wait_for_file, write_json


async def main(args: argparse.Namespace) -> None:
    async with corral.open_runtime(args.db, entities=[Counter], host=False) as rt:
        await wait_for_file(Path(args.fire))
        refs = [rt.ref(Counter, f"key-{n}") for n in range(args.keys)]
        start = Start(tenant="o")
        if args.role == "batch":
            acks = await rt.signal_many([
                corral.SignalItem(ref, Counter.add, Item(id=f"id-{n}"), message_id=f"id-{n}",
                                  start=start) for n, ref in enumerate(refs)])
        else:
            acks = await asyncio.gather(*(
                ref.signal_with_start(Counter.add, Item(id=f"id-{n}"), start=start,
                                      message_id=f"id-{n}") for n, ref in enumerate(refs)))
        write_json(Path(args.out), [a.status for a in acks])


if __name__ == "__main__":
    install_stacks()
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["batch", "singles"])
    parser.add_argument("--db", required=True)
    parser.add_argument("--fire", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--keys", type=int, default=100)
    asyncio.run(main(parser.parse_args()))
