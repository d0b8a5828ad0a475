"""Release 2 of `ray_env_entities.Probe` for the roll tests of `tests/ray/test_ray_env.py`
(a compatible build: one query more), imported by name in the host actors."""

from __future__ import annotations

import os

import corral
from ray_env_entities import Environ, Names


class Probe(corral.Entity):
    """Release 2: what release 1 has, and `names` (what it was started with)."""

    def __init__(self, init: Names) -> None:
        self.asked = init.names

    @corral.update
    def read(self, ask: Names) -> Environ:
        return Environ(values={n: os.environ.get(n) for n in ask.names}, pid=os.getpid())

    @corral.query
    def names(self) -> Names:  # new in release 2
        return Names(names=self.asked)


ENTITIES = [Probe]
"""Release 2 as `--app ray_env_release2:ENTITIES` (`corral deploy roll`)."""
