"""Lifecycle events as structured log lines: logger `corral.lifecycle`, level INFO.

One line per event (run started, run closed, continue-as-new, dead-lettered, lease
taken, lease lost), its fields also set on the record (`event`, `entity_type`, `key`,
`run_id`, ...) for structured handlers such as a JSON formatter. Quiet by default: a
library logger has no handler, and Python shows only warnings without one. Turn it on
with `logging.getLogger("corral.lifecycle").setLevel(logging.INFO)` and a handler.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["lifecycle"]

log = logging.getLogger("corral.lifecycle")


def lifecycle(event: str, entity_type: str | None = None, key: str | None = None,
              run_id: int | None = None, **fields: Any) -> None:
    """Log one lifecycle event (cheap when INFO is off)."""
    if not log.isEnabledFor(logging.INFO):
        return
    who = "" if entity_type is None else f" {entity_type} {key!r} run {run_id}"
    more = "".join(f" {k}={v}" for k, v in fields.items())
    log.info("%s%s%s", event, who, more, extra={
        "event": event, "entity_type": entity_type, "key": key, "run_id": run_id, **fields})
