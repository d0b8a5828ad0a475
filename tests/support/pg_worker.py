"""Worker process for tests/persistence/test_postgres_store.py:
`python pg_worker.py ROLE --url URL ...`.

Each role opens a `PostgresStore` on the shared database, runs a corral runtime on it
and reports through files the test reads (written atomically). Roles:

- `swarm`: a pure client; wait for a go file, report ready, wait for a fire file, then
  send `--count` concurrent `signal_with_start` calls to one key; write the acks.
- `stream`: a pure client; wait for a go file, then run `--senders` concurrent senders,
  each sending `--count` signals one after another to keys drawn from `--keys` keys
  (spread over every shard); write the acks.
- `host`: host every shard it can take (`--lease-ttl`), report ready with its owner and
  shards, then idle until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
from pathlib import Path
from typing import Any

import corral
from corral.persistence._postgres import open_postgres_store
from mp_entities import Note, Recorder, Start
from workers import install as install_stacks
from workers import wait_for_file, write_json

SHARDS = 16




async def swarm(args: argparse.Namespace) -> None:
    await wait_for_file(Path(args.go))
    store = await open_postgres_store(args.url, shards=SHARDS)
    try:
        async with corral.open_runtime(store, entities=[Recorder], shards=SHARDS,
                                       host=False) as rt:
            write_json(Path(args.ready), {"pid": os.getpid()})
            await wait_for_file(Path(args.fire))
            ref = rt.ref(Recorder, args.key)

            async def send(mid: str) -> dict[str, Any]:
                try:
                    ack = await ref.signal_with_start(Recorder.note, Note(mid=mid),
                                                      start=Start(origin=f"p{args.index}"),
                                                      message_id=mid)
                except Exception as err:
                    return {"mid": mid, "error": repr(err)}
                return {"mid": mid, "status": ack.status, "run_id": ack.run_id,
                        "seq": ack.seq, "started": ack.started}

            acks = await asyncio.gather(*(send(f"p{args.index}-{n}")
                                          for n in range(args.count)))
    finally:
        await store.close()
    write_json(Path(args.out), acks)


async def stream(args: argparse.Namespace) -> None:
    await wait_for_file(Path(args.go))
    store = await open_postgres_store(args.url, shards=SHARDS)
    acks: list[dict[str, Any]] = []
    try:
        async with corral.open_runtime(store, entities=[Recorder], shards=SHARDS,
                                       host=False) as rt:
            async def sender(index: int) -> None:
                rng = random.Random(f"{args.index}-{index}")
                for n in range(args.count):
                    key, mid = f"s-{rng.randrange(args.keys)}", f"p{args.index}-{index}-{n}"
                    ack = await rt.ref(Recorder, key).signal_with_start(
                        Recorder.note, Note(mid=mid), start=Start(origin="stream"),
                        message_id=mid)
                    acks.append({"key": key, "mid": mid, "seq": ack.seq,
                                 "run_id": ack.run_id})

            await asyncio.gather(*(sender(i) for i in range(args.senders)))
    finally:
        await store.close()
    write_json(Path(args.out), acks)


async def host(args: argparse.Namespace) -> None:
    store = await open_postgres_store(args.url, shards=SHARDS)
    async with corral.open_runtime(store, entities=[Recorder], shards=SHARDS,
                                   lease_ttl=args.lease_ttl) as rt:
        assert rt.host is not None
        write_json(Path(args.ready), {"owner": rt.host.owner,
                                       "shards": sorted(rt.host.shards)})
        await asyncio.Event().wait()  # until killed


def main(argv: list[str]) -> None:
    install_stacks()
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="role", required=True)
    for name in ("swarm", "stream", "host"):
        sub.add_parser(name).add_argument("--url", required=True)
    s = sub.choices["swarm"]
    for flag in ("--go", "--fire", "--ready", "--out", "--key"):
        s.add_argument(flag, required=True)
    s.add_argument("--index", type=int, required=True)
    s.add_argument("--count", type=int, required=True)
    st = sub.choices["stream"]
    for flag in ("--go", "--out"):
        st.add_argument(flag, required=True)
    for flag in ("--index", "--count", "--senders", "--keys"):
        st.add_argument(flag, type=int, required=True)
    h = sub.choices["host"]
    h.add_argument("--ready", required=True)
    h.add_argument("--lease-ttl", type=float, default=1.0)
    args = parser.parse_args(argv)
    role = {"swarm": swarm, "stream": stream, "host": host}[args.role]
    asyncio.run(role(args))


if __name__ == "__main__":
    main(sys.argv[1:])
