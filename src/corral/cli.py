"""The `corral` command.

    corral demo [--store PATH]    run the ticket-agent demo on a local SQLite store
    corral demo --ray             the same, hosted by a Ray shard actor (a local Ray
                                  instance, or the cluster named by RAY_ADDRESS)
    corral --version
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

import corral

__all__ = ["main"]

DEFAULT_DEMO_STORE = "corral-demo.db"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="corral",
        description="Durable, addressable entities for Python: atomic signal-with-start, "
                    "durable mailboxes, exactly-once application.",
    )
    parser.add_argument("--version", action="version", version=f"corral {corral.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo = commands.add_parser(
        "demo",
        help="run the ticket-agent demo (signal-with-start fed by duplicated webhooks)",
        description="Fire concurrent, out-of-order, duplicated webhooks at a ticket agent "
                    "on an in-process host and a SQLite store, then print what happened.",
    )
    demo.add_argument(
        "--store", default=DEFAULT_DEMO_STORE, metavar="PATH",
        help=f"SQLite file to use, deleted first so the demo is repeatable "
             f"(default: ./{DEFAULT_DEMO_STORE}; ':memory:' for no file)",
    )
    demo.add_argument(
        "--ray", action="store_true",
        help="host the ticket in a Ray shard actor: on a local Ray instance started for "
             "the demo, or on the cluster named by RAY_ADDRESS (whose nodes must reach "
             "the store file)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `corral` console script; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "demo":
        if args.ray and args.store == ":memory:":
            print("corral demo --ray: the shard actors need a store file, not ':memory:'")
            return 2
        return _demo(args.store, backend="ray" if args.ray else "local")
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse refuses others


def _demo(store: str, *, backend: str) -> int:
    # Imported here so `corral --help` does not load the demo's entity.
    from corral._demo import format_report, remove_store, run_demo

    remove_store(store)
    report = asyncio.run(run_demo(store, backend=backend))
    print(format_report(report))
    return 0
