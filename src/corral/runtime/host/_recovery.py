"""What building an activation reads and writes in the store, before and instead of
serving: which run is running, the run a terminate left unsettled, and the close of a
run whose activation cannot be built when its code says to fail it.

Written against `Residence` only; `Activation._load` decides when each is called.
"""

from __future__ import annotations

import logging
import traceback

from corral._common import RunStatus
from corral.persistence import RunRecord

from ._residence import Residence

__all__ = ["fail_unbuilt", "running_run", "settle_terminated"]

log = logging.getLogger("corral.activation")


async def running_run(home: Residence) -> RunRecord | int:
    """The entity's running run; else the id of its latest run (0: none), which the
    shard no longer holds suspended and whose terminate is settled here."""
    found = await home.store.latest_run(home.entity_type, home.key)
    if found is None or found[0].status is not RunStatus.RUNNING:
        run_id = found[0].run_id if found else 0
        home.release(run_id)
        if found is not None and found[0].status is RunStatus.TERMINATED:
            await settle_terminated(home, run_id)
        return run_id
    run = found[0]
    if run.run_id > 1 and run.continued_from is None:  # it replaced a closed run
        await settle_terminated(home, run.run_id - 1)
    return run


async def settle_terminated(home: Residence, run_id: int) -> None:
    """A run terminated while no host had it in memory: the messages after its latest
    snapshot were never applied; they become its dead letters (see
    `persistence._unapplied`). A no-op for a run settled before or not terminated."""
    added = await home.store.settle_run(home.fence, home.entity_type, home.key, run_id,
                                        applied_seq=None, failed_at=home.clock.time())
    if added:
        log.warning("%s %r run %d: %d messages it never applied are kept as dead letters",
                    home.entity_type, home.key, run_id, added)


async def fail_unbuilt(home: Residence, run_id: int, snapshot_seq: int, err: Exception,
                       attempts: int) -> None:
    """Close the run as failed: its activation cannot be built, and the code says so
    (`FailRun`, `fail_on`) or `run_retry.max_attempts` ran out."""
    text = "".join(traceback.format_exception(err))
    log.error("%s %r run %d: activation failed %d times; the run is failed:\n%s",
              home.entity_type, home.key, run_id, attempts, text)
    # What the discarded state had applied beyond its snapshot was never applied:
    # the close keeps every message after the snapshot as a dead letter of the run.
    await home.store.close_run(
        home.fence, home.entity_type, home.key, run_id, applied_seq=snapshot_seq,
        status=RunStatus.FAILED, result=None, force=True,
        error=f"activation failed after {attempts} attempts: {type(err).__name__}: {err}\n{text}")
