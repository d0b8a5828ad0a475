"""A TCP proxy between corral and PostgreSQL that a test can partition: a real network
fault, unlike `pg_terminate_backend` (which ends a session at once, with a goodbye).

While partitioned the proxy forwards nothing in either direction and connects nothing
upstream, yet closes no socket: each side sees a silent link, as behind a dropped
route. Bytes sent meanwhile are held and delivered once it heals (as TCP retransmits),
so a connection the server ended meanwhile learns it only then.

    async with TcpProxy(url) as proxy:
        store = await open_postgres_store(proxy.url, shards=4)
        proxy.partition()
        ...
        proxy.heal()
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit, urlunsplit

__all__ = ["TcpProxy"]

_CHUNK = 65536


class TcpProxy:
    """Forwards 127.0.0.1:<port> to the host and port of `url`; `url` is its own URL."""

    def __init__(self, target_url: str) -> None:
        parts = urlsplit(target_url)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._parts = parts
        self._server: asyncio.Server | None = None
        self._healed = asyncio.Event()
        self._healed.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._trap: bytes | None = None
        self.url = ""

    async def __aenter__(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        user = f"{self._parts.username}@" if self._parts.username else ""
        self.url = urlunsplit(self._parts._replace(netloc=f"{user}127.0.0.1:{port}"))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.heal()
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def partitioned(self) -> bool:
        return not self._healed.is_set()

    def partition(self) -> None:
        """Stop forwarding, both ways, on every connection and for new ones."""
        self._healed.clear()

    def heal(self) -> None:
        """Forward again, held bytes first."""
        self._trap = None
        self._healed.set()

    def partition_before(self, marker: bytes) -> None:
        """Partition the moment a client sends bytes containing `marker`, before they
        pass: `partition_before(b"COMMIT\\0")` cuts a client off inside the transaction
        it is about to commit (the server holds its locks, idle in transaction)."""
        self._trap = marker

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        ends = [writer]
        self._writers.add(writer)
        try:
            await self._healed.wait()  # a connect during a partition hangs
            up_reader, up_writer = await asyncio.open_connection(*self._target)
            ends.append(up_writer)
            self._writers.add(up_writer)
            await asyncio.gather(self._pump(reader, up_writer, upstream=True),
                                 self._pump(up_reader, writer, upstream=False))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            for end in ends:
                self._writers.discard(end)
                end.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                    upstream: bool) -> None:
        """Copy until the end of the stream, the end too held while partitioned."""
        try:
            while True:
                data = await reader.read(_CHUNK)
                if upstream and self._trap is not None and self._trap in data:
                    self.partition()
                await self._healed.wait()
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                writer.close()
