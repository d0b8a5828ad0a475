"""Entities of the Ray environment tests (`tests/ray/test_ray_env.py`), imported by name
in the host actors (`tests/support` is on their `PYTHONPATH`)."""

from __future__ import annotations

import os

from pydantic import BaseModel

import corral


class Names(BaseModel):
    names: list[str]


class Environ(BaseModel):
    values: dict[str, str | None]
    pid: int


class Probe(corral.Entity):
    """Reads its host's environment: which variables reached the actor."""

    def __init__(self, init: Names) -> None:
        self.asked = init.names

    @corral.update
    def read(self, ask: Names) -> Environ:
        return Environ(values={n: os.environ.get(n) for n in ask.names}, pid=os.getpid())


class DedicatedProbe(Probe):
    """`Probe` in an actor of its own (dedicated placement)."""

    placement = "dedicated"
    ray_options = {"num_cpus": 0}
