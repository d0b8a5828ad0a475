"""Starting Ray without taking SIGTERM from the server that runs the application.

`ray.init` in a driver sets its own SIGTERM handler (`sys.exit(15)`, Ray 2.x,
`ray/_private/worker.py`), replacing whatever handled SIGTERM before. Under an ASGI
server that is the server's own handler: uvicorn installs one for the whole of
`Server.serve` (`capture_signals`) and on SIGTERM stops accepting, finishes the
requests in flight and runs the lifespan's shutdown. A runtime opened in the lifespan
starts Ray after that, so a SIGTERM then raised `SystemExit` in the middle of the
event loop: a traceback, cancelled requests, and a lifespan that never closed the
runtime (nor shut down the Ray instance it started).

`keeping_sigterm()` puts a Python-level handler that was there before `ray.init` back
afterwards. Without one (SIGTERM at its default, a plain script), Ray's handler stays:
Ray's own behaviour for a driver is unchanged.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["keeping_sigterm"]


@contextlib.contextmanager
def keeping_sigterm() -> Iterator[None]:
    """Around `ray.init`: the SIGTERM handler installed before it (a server's, the
    application's) is installed again after it, so it stays the one that runs.

    Only the main thread can set signal handlers (and Ray sets its own only there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        # A Python callable: someone chose how this process stops; SIG_DFL, SIG_IGN or
        # None (set from C): nothing to keep, Ray's handler stays.
        if callable(before):
            signal.signal(signal.SIGTERM, before)
