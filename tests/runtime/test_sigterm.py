"""`keeping_sigterm`: what handled SIGTERM before `ray.init` handles it after (no Ray
needed: the body stands for `ray.init`, which sets its own handler the same way)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from types import FrameType

import pytest

from corral.runtime.ray._sigterm import keeping_sigterm


def _server(signum: int, frame: FrameType | None) -> None:  # uvicorn's handle_exit, say
    pass


def _ray(signum: int, frame: FrameType | None) -> None:  # ray.init's sigterm_handler
    pass


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def test_a_servers_sigterm_handler_stays_the_one_that_runs() -> None:
    signal.signal(signal.SIGTERM, _server)
    with keeping_sigterm():
        signal.signal(signal.SIGTERM, _ray)
    assert signal.getsignal(signal.SIGTERM) is _server


def test_without_a_handler_before_ray_keeps_its_own() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with keeping_sigterm():
        signal.signal(signal.SIGTERM, _ray)
    assert signal.getsignal(signal.SIGTERM) is _ray


def test_the_handler_is_put_back_when_ray_init_fails() -> None:
    def ray_init() -> None:
        with keeping_sigterm():
            signal.signal(signal.SIGTERM, _ray)
            raise ConnectionError("no Ray there")

    signal.signal(signal.SIGTERM, _server)
    with pytest.raises(ConnectionError):
        ray_init()
    assert signal.getsignal(signal.SIGTERM) is _server


def test_outside_the_main_thread_nothing_is_touched() -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with keeping_sigterm():
                pass
        except BaseException as err:  # signal.signal would raise ValueError here
            errors.append(err)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert errors == []
