"""Worker process for tests/runtime/test_bounded_faults.py: `python mp_bounded_worker.py ROLE ...`.

Roles:

- `churn`: open the store (`--db`: a SQLite file or a PostgreSQL URL) as a host, wait
  until this process holds the shards of the `ChurnLedger` and `ChurnMailbox` entities
  (taken from a SIGKILLed predecessor), append `hosting` to `--status`, then stream
  signals to both from `--senders` concurrent senders until killed. Each acknowledged
  signal is appended to `--acklog` as one line `etype key mid seq run_id`, in one
  `write()` after its ack. The entities snapshot every 5 signals and continue as new
  every ~40, so a SIGKILL at any moment lands near a snapshot or a continue-as-new.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import BinaryIO

import corral
from bounded_entities import Chain, ChurnLedger, ChurnMailbox, Note

ENTITIES: list[type[corral.Entity]] = [ChurnLedger, ChurnMailbox]
LEDGER_KEY, MAILBOX_KEY = "ledger", "mailbox"


async def churn(args: argparse.Namespace, log: BinaryIO, status: BinaryIO) -> None:
    async with corral.open_runtime(args.db, entities=ENTITIES, lease_ttl=args.lease_ttl) as rt:
        targets = [(rt.ref(ChurnLedger, LEDGER_KEY), ChurnLedger.note),
                   (rt.ref(ChurnMailbox, MAILBOX_KEY), ChurnMailbox.notes)]
        assert rt.host is not None
        deadline = time.monotonic() + 60
        while not all(rt.host.shard(ref.shard) is not None for ref, _ in targets):
            if time.monotonic() > deadline:
                raise TimeoutError("never got the entities' shards")
            await asyncio.sleep(0.01)
        status.write(b"hosting\n")

        async def sender(s: int) -> None:
            ref, handler = targets[s % len(targets)]
            n = 0
            while True:
                mid = f"{args.prefix}-{s}-{n}"
                ack = await ref.signal_with_start(handler, Note(mid=mid), start=Chain(),
                                                  message_id=mid)
                log.write(f"{ref.definition.name} {ref.key} {mid} {ack.seq} "
                          f"{ack.run_id}\n".encode())
                n += 1

        await asyncio.gather(*(sender(s) for s in range(args.senders)))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="role", required=True)
    ch = sub.add_parser("churn")
    ch.add_argument("--db", required=True)
    ch.add_argument("--lease-ttl", type=float, default=1.0)
    ch.add_argument("--acklog", required=True)
    ch.add_argument("--status", required=True)
    ch.add_argument("--prefix", required=True)
    ch.add_argument("--senders", type=int, default=8)
    args = parser.parse_args(argv)
    # Unbuffered: each line reaches the file in one write().
    with open(args.acklog, "ab", buffering=0) as log, \
            open(args.status, "ab", buffering=0) as status:
        asyncio.run(churn(args, log, status))


if __name__ == "__main__":
    main(sys.argv[1:])
