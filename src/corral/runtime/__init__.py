"""The runtime, in three roles: the client (`client/`: `Runtime`, `EntityRef`, the checks
at the boundary, the request records and the seam `client._backend.Backend`), hosting
(`host/`: shards, activations, applying, steps, outbox, hand-offs, `LocalBackend`) and the
Ray backend (`ray/`: the named host actors, placement, rolls, nodes). The client imports
neither other role; hosting never imports the Ray backend; `_open.open_runtime` is where
they meet (tests/runtime/test_public_surface.py keeps these rules). The runtime reaches
storage only through the `corral.persistence.Store` protocol.

Its `__all__` is what users need (the client, its records, `deploy`, `deploy_status`,
`ray_nodes`, `drain_node` and `stop_ray_hosts`); the shard, activation and host classes are
internals of their private modules.

The path of a signal, `ref.signal_with_start(...)`, below (an update, a delivery or a
read is another record of `client._requests`, on the same path to `LocalBackend.handle`,
which hands it to the method named after its kind). Each numbered line is one step: a
function first entered in that order. Names are relative to `corral.runtime`, or
absolute when they start with `corral.`. `tests/runtime/test_signal_path.py` traces one
call of each local path and checks it against its list, and checks that every named
step exists.

Local backend, one process, to a running entity:

1. `client._ref.EntityRef.signal_with_start`
2. `client._ref.EntityRef.signal_acceptance`: checks handler, payload, start input and
   id (`client._boundary.Boundary`) and builds a `persistence.Acceptance` naming the
   ref's shard (`client._router.Router` routed the key when the ref was made).
3. `host._local_backend.LocalBackend.handle`: hands the record, by its kind, to
4. `host._local_backend.LocalBackend.accept`
5. `corral.persistence._store_core.StoreCore.accept`: starts, dedupes and appends in one
   group commit (SQLite: the store's `CommitQueue`, its writer task, one transaction in
   the writer thread).
6. `host._local_backend.LocalBackend._to_shard`: the committed entry goes to the shard
   this process hosts (another process hosting it finds the entry by tailing the
   journal, `host._host.LocalHost`; a store's tail leaves out what its own process
   committed and handed over here).
7. `host._shard.Shard.take_accepted`
8. `host._shard.Shard.route`: to the entity's activation (made if none is in memory)
9. `host._activation.Activation.queue`: into its inbox, a worker task started if none
   runs; nothing is applied here.
10. `client._ref.ack`: the caller's `Ack`, built from the commit. No step above waits
    for user code: a handler never holds an Ack up.
11. `host._activation.Activation._drain`: the worker task, after the caller's step,
    applies the inbox in seq order:
12. `host._activation.Activation._apply`
13. `host._activation.Activation._run_handler`
14. `host._poison.apply_live`: calls the handler (retried, or dead-lettered, if it raises).

Local backend, one process, to an entity it starts (the run this call opens):

1. `client._ref.EntityRef.signal_with_start`
2. `host._local_backend.LocalBackend.accept`
3. `corral.persistence._store_core.StoreCore.accept`
4. `host._shard.Shard.take_accepted`
5. `host._shard.Shard.route_started`: a new `Activation`, given the run's first entry
   (no store read; it never passes through `Activation.queue`)
6. `host._activation.Activation.__init__`: starts its load task
7. `client._ref.ack`
8. `host._activation.Activation._load`: the load task, after the caller's step:
9. `host._activation.Activation._start_fresh`: `__init__(start)`
10. `host._activation.Activation._serve`
11. `host._activation.Activation._drain`
12. `host._poison.apply_live`

Ray backend, client process -> host actor (not traced; the names are checked):

1. `client._ref.EntityRef.signal_acceptance`: as above, in the client process.
2. `ray._connection.RayBackend.handle`: queues the record per shard (`RayBackend._accept`)
3. `ray._connection.RayBackend._flush`: on the event loop's next turn, the shard's queue
   goes as one `client._requests.AcceptBatch`, sent by a task:
4. `ray._connection.RayBackend._send`
5. `ray._connection.RayBackend.call`: one Ray call to the shard's host actor as the
   directory names it (placed by the deployment's placer if need be; re-routed on
   `ShardMovedError`, retried while it restarts).
6. `ray._shard_host.ShardHost.handle`: in the actor;
7. `ray._shard_host.ShardHost._accept_batch`: checks the routing (each key hashed again
   only if the batch was routed with another shard count), then
8. `host._local_backend.LocalBackend.accept_many`: one group commit, then, for each
   entry, the local steps from `LocalBackend._to_shard` on; the results travel back
   as `AcceptResult.to_wire` tuples to each caller's future. Every other record is one
   `ShardHost.handle(record)` call, run by the actor's `LocalBackend.handle(record)`.
"""

from corral._schedule_spec import Calendar, Cron, Interval, Overlap, Schedule
from corral.persistence import DeadLetter

from ._build_registration import BuildInfo
from ._open import open_runtime
from .client._boundary import Authorize, AuthRequest, Limits
from .client._inspection import (
    EntityHistory,
    EntityState,
    MessageInfo,
    StepInfo,
    TimerInfo,
    WaitSummary,
)
from .client._options import MAX_SHARDS
from .client._ref import QUERY_TIMEOUT, EntityRef
from .client._results import (
    Ack,
    Delivery,
    DeliveryStatus,
    EntityDescription,
    EntitySummary,
    Page,
    RunSummary,
    SignalWaitInfo,
)
from .client._runtime import Runtime
from .client._schedules import BackfillResult, ScheduleInfo, ScheduleOutcome
from .client._signal_many import SignalItem
from .ray._cluster_nodes import DrainReport, RayNode, drain_node, ray_nodes, undrain_node
from .ray._deployment import (
    RollReport,
    RollStep,
    deploy,
    deploy_status,
    roll_ray_hosts,
    stop_ray_hosts,
)
from .ray._release import DeploymentStatus, DeployReport, HostStatus, Release

__all__ = [
    "MAX_SHARDS",
    "QUERY_TIMEOUT",
    "Ack",
    "AuthRequest",
    "Authorize",
    "BackfillResult",
    "BuildInfo",
    "Calendar",
    "Cron",
    "DeadLetter",
    "Delivery",
    "DeliveryStatus",
    "DeployReport",
    "DeploymentStatus",
    "DrainReport",
    "EntityDescription",
    "EntityHistory",
    "EntityRef",
    "EntityState",
    "EntitySummary",
    "HostStatus",
    "Interval",
    "Limits",
    "MessageInfo",
    "Overlap",
    "Page",
    "RayNode",
    "Release",
    "RollReport",
    "RollStep",
    "RunSummary",
    "Runtime",
    "Schedule",
    "ScheduleInfo",
    "ScheduleOutcome",
    "SignalItem",
    "SignalWaitInfo",
    "StepInfo",
    "TimerInfo",
    "WaitSummary",
    "deploy",
    "deploy_status",
    "drain_node",
    "open_runtime",
    "ray_nodes",
    "roll_ray_hosts",
    "stop_ray_hosts",
    "undrain_node",
]
