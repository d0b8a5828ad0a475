"""Worker process for tests/runtime/test_multiprocess.py: `python mp_worker.py ROLE --db STORE ...`.

Each role opens a corral runtime on the shared store (`--db`: a SQLite file or a
PostgreSQL URL, as the test's `db_path`) and reports what it saw
through files the test reads (acks as JSON or one line per ack). Roles:

- `swarm`: wait for a go file, open the runtime, report ready, wait for a fire file,
  then send `--count` concurrent `signal_with_start` calls to one key; write the acks.
- `interleave`: wait for a go file, then send `--count` signals one at a time,
  alternating over `--keys`; write the acks.
- `stream`: host, and stream `--total` signals from `--senders` concurrent senders to
  `--keys` keys, appending each acknowledged id to an ack log (every tenth is sent
  again at once, as a client retry, and must come back as a duplicate); then idle
  until killed.
- `send`: a pure client (`host=False`) sending `--count` signals one after another.
- `pipeline`: host `Pipeline` entities, feed them jobs, report ready once `run()`
  processed them; then idle until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

import corral
from mp_entities import Clocked, Job, Note, Pipeline, Recorder, Start
from workers import install as install_stacks
from workers import wait_for_file, write_json

ENTITIES: list[type[corral.Entity]] = [Clocked, Pipeline, Recorder]




async def _idle_until_killed() -> None:
    await asyncio.Event().wait()


async def swarm(args: argparse.Namespace) -> None:
    await wait_for_file(Path(args.go))
    async with corral.open_runtime(args.db, entities=ENTITIES, lease_ttl=args.lease_ttl) as rt:
        write_json(Path(args.ready), {"pid": os.getpid()})
        await wait_for_file(Path(args.fire))
        ref = rt.ref(Recorder, args.key)
        mids = [f"p{args.index}-{n}" for n in range(args.count)]

        async def send(mid: str) -> dict[str, Any]:
            try:
                ack = await ref.signal_with_start(Recorder.note, Note(mid=mid),
                                                  start=Start(origin=f"p{args.index}"),
                                                  message_id=mid)
            except Exception as err:
                return {"mid": mid, "error": repr(err)}
            return {"mid": mid, "status": ack.status, "run_id": ack.run_id, "seq": ack.seq,
                    "started": ack.started}

        acks = await asyncio.gather(*(send(m) for m in mids))
    write_json(Path(args.out), acks)


async def stream(args: argparse.Namespace, log: BinaryIO) -> None:
    keys = [f"stream-{k}" for k in range(args.keys)]
    async with corral.open_runtime(args.db, entities=ENTITIES, lease_ttl=args.lease_ttl) as rt:
        refs = [rt.ref(Recorder, k) for k in keys]

        async def sender(first: int) -> None:
            for n in range(first, args.total, args.senders):
                ref = refs[n % len(refs)]
                mid = f"m{n}"
                ack = await ref.signal_with_start(Recorder.note, Note(mid=mid),
                                                  start=Start(origin="stream"), message_id=mid)
                log.write(f"{ref.key} {mid} {ack.seq} {ack.run_id}\n".encode())
                if n % 10 == 0:  # a client retrying after a lost ack: must be a duplicate
                    again = await ref.signal_with_start(Recorder.note, Note(mid=mid),
                                                        start=Start(origin="stream"),
                                                        message_id=mid)
                    if (again.status, again.seq) != ("duplicate", ack.seq):
                        raise AssertionError(f"retry of {mid}: {again} after {ack}")

        await asyncio.gather(*(sender(i) for i in range(args.senders)))
        log.write(b"done\n")
        await _idle_until_killed()


async def interleave(args: argparse.Namespace) -> None:
    await wait_for_file(Path(args.go))
    keys = args.keys.split(",")
    acks: list[dict[str, Any]] = []
    async with corral.open_runtime(args.db, entities=ENTITIES, host=args.host == "yes",
                                   lease_ttl=args.lease_ttl) as rt:
        for n in range(args.count):  # one at a time: each send is its own transaction
            key, mid = keys[n % len(keys)], f"p{args.index}-{n}"
            ack = await rt.ref(Recorder, key).signal_with_start(
                Recorder.note, Note(mid=mid), start=Start(origin=f"p{args.index}"),
                message_id=mid)
            acks.append({"key": key, "mid": mid, "status": ack.status, "run_id": ack.run_id,
                         "seq": ack.seq, "started": ack.started})
    write_json(Path(args.out), acks)


async def send(args: argparse.Namespace) -> None:
    acks: list[dict[str, Any]] = []
    async with corral.open_runtime(args.db, entities=ENTITIES, host=False) as rt:
        ref = rt.ref(Clocked, args.key)
        for n in range(args.count):
            mid = f"c{n}"
            ack = await ref.signal_with_start(Clocked.note, Note(mid=mid),
                                              start=Start(origin="client"), message_id=mid)
            acks.append({"mid": mid, "seq": ack.seq, "run_id": ack.run_id,
                         "acked_at": time.time()})
    write_json(Path(args.out), acks)


async def pipeline(args: argparse.Namespace) -> None:
    keys = args.keys.split(",")
    async with corral.open_runtime(args.db, entities=ENTITIES, lease_ttl=args.lease_ttl) as rt:
        for key in keys:
            ref = rt.ref(Pipeline, key)
            for n in range(1, args.jobs + 1):
                await ref.signal_with_start(Pipeline.jobs, Job(mid=f"{key}-j{n}"),
                                            start=Start(origin="A"), message_id=f"{key}-j{n}")
        deadline = time.monotonic() + 60
        for key in keys:
            want = [f"{key}-j{n}" for n in range(1, args.jobs + 1)]
            while await rt.ref(Pipeline, key).query(Pipeline.done) != want:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"run() of {key} never processed its jobs")
                await asyncio.sleep(0.01)
        assert rt.host is not None
        write_json(Path(args.ready), {"owner": rt.host.owner,
                                       "shards": sorted(rt.host.shards)})
        await _idle_until_killed()


def main(argv: list[str]) -> None:
    install_stacks()
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="role", required=True)
    for name in ("swarm", "interleave", "stream", "send", "pipeline"):
        p = sub.add_parser(name)
        p.add_argument("--db", required=True)
        p.add_argument("--lease-ttl", type=float, default=1.0)
    s = sub.choices["swarm"]
    for flag in ("--go", "--fire", "--ready", "--out", "--key"):
        s.add_argument(flag, required=True)
    s.add_argument("--index", type=int, required=True)
    s.add_argument("--count", type=int, required=True)
    il = sub.choices["interleave"]
    for flag in ("--go", "--out", "--keys", "--host"):
        il.add_argument(flag, required=True)
    il.add_argument("--index", type=int, required=True)
    il.add_argument("--count", type=int, required=True)
    st = sub.choices["stream"]
    st.add_argument("--acklog", required=True)
    st.add_argument("--total", type=int, required=True)
    st.add_argument("--senders", type=int, required=True)
    st.add_argument("--keys", type=int, required=True)
    se = sub.choices["send"]
    se.add_argument("--out", required=True)
    se.add_argument("--key", required=True)
    se.add_argument("--count", type=int, required=True)
    pi = sub.choices["pipeline"]
    pi.add_argument("--ready", required=True)
    pi.add_argument("--keys", required=True)
    pi.add_argument("--jobs", type=int, required=True)
    args = parser.parse_args(argv)
    if args.role == "stream":
        # Unbuffered: each ack line reaches the file in one write() before the next send.
        with open(args.acklog, "ab", buffering=0) as log:
            asyncio.run(stream(args, log))
        return
    role = {"swarm": swarm, "interleave": interleave, "send": send,
            "pipeline": pipeline}[args.role]
    asyncio.run(role(args))


if __name__ == "__main__":
    main(sys.argv[1:])
