"""Worker process for tests/runtime/test_reorder_window.py:
`python window_worker.py host --db STORE --ready FILE` hosts `Inbox` entities, reports
ready, and idles until killed."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

import corral
from window_entities import Inbox
from workers import install as install_stacks
from workers import write_json


async def main(args: argparse.Namespace) -> None:
    async with corral.open_runtime(args.db, entities=[Inbox], lease_ttl=2.0):
        write_json(Path(args.ready), {"pid": os.getpid()})
        await asyncio.Event().wait()


if __name__ == "__main__":
    install_stacks()
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["host"])
    parser.add_argument("--db", required=True)
    parser.add_argument("--ready", required=True)
    asyncio.run(main(parser.parse_args()))
