"""A Ray deployment's release: the code every host actor runs, declared, never inherited.

A release is an app path (`_app_path`: `"pkg.module:APP"`), a Ray `runtime_env` that
ships the code (its local `working_dir` and `py_modules` uploaded by whoever declares
the release, as `ray job submit` does, and kept as the `gcs://` URIs Ray gave them),
the host actors' Ray options and how many hosts. It is recorded in the store
(`Store.declare_release`), so that the placer (`_placer`), restarted anywhere, reads
the current release there, and every host actor imports the app itself, inside the
release's runtime_env: no entity class ever travels from a client to a host, so two
releases may (and do) use the same module names.

Its `tag` is the build: a hash of every entity type's manifest, which covers the
handlers and their models, the state's fields and version, and a hash of the code
(`EntityDefinition.code`), so a body-only fix is a new build. Its `id` adds the
runtime_env and the actor options, and names the host actors
(`corral/<ns>/host-<node>-<n>@<id>`); a release whose id differs from the current one
is rolled to, shard by shard (`_placer`).

`deploy` is the one way to start or change a deployment: it resolves the runtime_env,
imports the app in it (a Ray task) to learn its manifests, and asks the placer to
declare it (refused before anything moves if the current release cannot be replaced
by it), then waits for the roll.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import inspect
import json
import logging
import os
import socket
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from corral._errors import CorralError, CorruptRowError, InvalidArgumentError
from corral.persistence import ReleaseRecord

__all__ = ["DeployReport", "DeploymentStatus", "HostStatus", "Release", "declared_by",
           "inspect_release", "release_tag", "resolve_runtime_env"]

log = logging.getLogger("corral.ray")

MAX_RELEASE_TEXT = 256 * 1024
"""Bytes of a release's runtime_env and options as JSON, at most (URIs, not code)."""


def release_tag(manifests: Mapping[str, str]) -> str:
    """The build of a set of entity types: a hash of their manifests (JSON text)."""
    text = "\0".join(f"{name}={manifests[name]}" for name in sorted(manifests))
    return hashlib.blake2b(text.encode(), digest_size=5).hexdigest()


def _digest(*parts: Any, size: int = 5) -> str:
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=size).hexdigest()


@dataclass(frozen=True, slots=True)
class Release:
    """One declared release of a Ray deployment (see the module docstring), as the
    store keeps it (`ReleaseRecord`: its number, its `body()` and who declared it when).

    Attributes:
        namespace: the deployment.
        app: the app path the hosts import (`_app_path`).
        runtime_env: the hosts' Ray runtime_env, local paths uploaded (`gcs://` URIs).
        actor_options: the hosts' other Ray actor options (`num_cpus`, `resources`...).
        hosts: host actors wanted: a total, {node id: count}, or None (one per node).
        manifests: {entity type: manifest JSON} of the app's code.
        seq: its number in the deployment's history of releases (1, 2, ...; a rollback
            is a new number with an older release's code).
        declared_at, declared_by: when (epoch s) and by whom (user@host pid).
    """

    namespace: str
    app: str
    runtime_env: dict[str, Any]
    actor_options: dict[str, Any]
    hosts: int | dict[str, int] | None
    manifests: dict[str, str]
    seq: int = 0
    declared_at: float = 0.0
    declared_by: str = ""

    @property
    def tag(self) -> str:
        """The build (`release_tag` of the manifests)."""
        return release_tag(self.manifests)

    @property
    def id(self) -> str:
        """What the host actors are named by: the build, the runtime_env, the options."""
        return _digest(self.app, self.tag, self.runtime_env, self.actor_options)

    @property
    def key(self) -> str:
        """The whole declaration (`id` and `hosts`): declaring the current key again
        changes nothing."""
        return _digest(self.id, self.hosts, size=8)

    def body(self) -> str:
        """The JSON text the store keeps."""
        return json.dumps({"app": self.app, "runtime_env": self.runtime_env,
                           "actor_options": self.actor_options, "hosts": self.hosts,
                           "manifests": self.manifests}, sort_keys=True,
                          separators=(",", ":"))

    @classmethod
    def of_record(cls, record: ReleaseRecord) -> Release:
        """The release a stored row describes.

        Raises:
            CorruptRowError: the body is not a release's (damaged, or written by hand).
        """
        try:
            body = json.loads(record.body)
            release = cls(record.namespace, body["app"], dict(body["runtime_env"]),
                          dict(body["actor_options"]), body["hosts"],
                          {str(k): str(v) for k, v in body["manifests"].items()},
                          record.seq, record.declared_at, record.declared_by)
            if not isinstance(release.app, str):
                raise TypeError("app")
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise CorruptRowError(
                f"release {record.seq} of {record.namespace!r} in the store is not a "
                f"release ({type(err).__name__}: {err})", table="releases",
                column="body") from None
        return release

    def handles(self, entity_type: str, name: str) -> bool:
        """Whether this release's code has a signal or update handler `name` of
        `entity_type` (today's name or a `renamed_from=` one)."""
        text = self.manifests.get(entity_type)
        if text is None:
            return False
        handlers = json.loads(text).get("handlers", {})
        return any(item.get("kind") != "query" and (n == name or name in
                   item.get("renamed_from", ())) for n, item in handlers.items())

    def __str__(self) -> str:
        return f"release {self.seq} ({self.id}, app {self.app})"


@dataclass(frozen=True, slots=True)
class HostStatus:
    """One host actor of a deployment: its name, node, release id and shard count."""

    name: str
    node: str
    release_id: str
    shards: int


@dataclass(frozen=True, slots=True)
class DeploymentStatus:
    """What `deploy_status` reports: the current and previous releases, the hosts,
    how many of the `shards` are on the current release, and whether a roll is on."""

    namespace: str
    release: Release | None
    previous: Release | None
    hosts: tuple[HostStatus, ...]
    shards: int
    on_release: int
    drained: tuple[str, ...] = ()

    @property
    def rolling(self) -> bool:
        return self.release is not None and self.on_release < self.shards


@dataclass(frozen=True, slots=True)
class DeployReport:
    """What `deploy` did: the release now current, the one before, the shards moved
    (in order) and those already on it, and the seconds it took. `unchanged`: the
    release was the current one already (nothing was recorded)."""

    release: Release
    previous: Release | None
    steps: tuple[Any, ...] = ()
    skipped: tuple[int, ...] = ()
    seconds: float = 0.0
    unchanged: bool = False
    notes: tuple[str, ...] = field(default=())


def declared_by() -> str:
    """`user@host pid N`: who declares a release."""
    with contextlib.suppress(Exception):
        user = getpass.getuser()
        return f"{user}@{socket.gethostname()} pid {os.getpid()}"
    return f"{socket.gethostname()} pid {os.getpid()}"


def resolve_runtime_env(runtime_env: Mapping[str, Any] | None) -> dict[str, Any]:
    """`runtime_env` as a release keeps it: JSON data, its local `working_dir` and
    `py_modules` uploaded to the connected Ray cluster and replaced by their `gcs://`
    URIs (Ray's own upload, as for `ray.init(runtime_env=...)` and `ray job submit`:
    `.gitignore` and `excludes` respected, the same content the same URI). Blocking.

    Raises:
        InvalidArgumentError: not a dict of JSON data, too large, or a path Ray refuses
            (missing, or a package above Ray's size limit).
    """
    if runtime_env is None:
        return {}
    if not isinstance(runtime_env, Mapping):
        raise InvalidArgumentError(
            f"runtime_env must be a dict, got {type(runtime_env).__name__}")
    try:
        env = json.loads(json.dumps(dict(runtime_env)))
    except (TypeError, ValueError) as err:
        raise InvalidArgumentError(f"runtime_env must be JSON data: {err}") from None
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    with tempfile.TemporaryDirectory(prefix="corral-release-") as scratch:
        try:
            for upload in (upload_py_modules_if_needed, upload_working_dir_if_needed):
                kwargs: dict[str, Any] = {"scratch_dir": scratch, "logger": log}
                if "include_gitignore" in inspect.signature(upload).parameters:
                    kwargs["include_gitignore"] = True
                env = upload(env, **kwargs)
        except (ValueError, TypeError, OSError, RuntimeError) as err:
            raise InvalidArgumentError(f"runtime_env: {err}") from err
    env.pop("excludes", None)
    if len(json.dumps(env)) > MAX_RELEASE_TEXT:
        raise InvalidArgumentError(f"runtime_env is above {MAX_RELEASE_TEXT} bytes as "
                                   f"JSON: ship code with working_dir or py_modules")
    return dict(env)


def _manifests_of(app: str) -> dict[str, str]:
    """Inside the release's runtime_env (a Ray task): the app's manifests."""
    from corral.actors._manifest import manifest_json
    from corral.runtime._app_path import load_entities

    return {cls._corral_definition.name: manifest_json(cls._corral_definition)
            for cls in load_entities(app)}


def inspect_release(app: str, runtime_env: Mapping[str, Any], timeout: float
                    ) -> dict[str, str]:
    """Import `app` where the hosts will (a Ray task in `runtime_env`), so that an app
    the cluster cannot import is refused here, before anything is declared; its
    manifests. Blocking.

    Raises:
        InvalidArgumentError: the app does not import there (naming why), or the
            runtime_env cannot be set up.
    """
    import ray
    from ray import exceptions as rex

    task = ray.remote(num_cpus=0, max_retries=0)(_manifests_of)
    try:
        found: dict[str, str] = ray.get(
            task.options(runtime_env=dict(runtime_env)).remote(app), timeout=timeout)
    except rex.RayTaskError as err:
        cause = err.cause
        if isinstance(cause, CorralError):
            raise type(cause)(f"{cause} (imported where the hosts run, in the release's "
                              f"runtime_env)") from None
        raise InvalidArgumentError(f"app {app}: {cause!r}") from None
    except rex.RuntimeEnvSetupError as err:
        raise InvalidArgumentError(f"the release's runtime_env could not be set up on "
                                   f"the cluster: {err}") from None
    except rex.GetTimeoutError:
        raise CorralError(f"importing app {app} in the release's runtime_env took more "
                          f"than {timeout:.0f} s") from None
    return found


def report_json(report: DeployReport | DeploymentStatus) -> dict[str, Any]:
    """A report as JSON data (the CLI's `--json`)."""
    data = asdict(report)
    for key in ("release", "previous"):
        release = getattr(report, key)
        if release is not None:
            data[key] = {**data[key], "id": release.id, "tag": release.tag,
                         "manifests": sorted(release.manifests)}
    return data
