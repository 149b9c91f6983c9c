"""A TCP proxy a test can cut: stands in front of one server (Redis) to make it disappear."""

from __future__ import annotations

import asyncio
import contextlib


class Proxy:
    """A TCP proxy to Redis that the test can cut (every connection dropped and refused)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.cut = False
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers |= {writer, up_writer}
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await source.read(65536):
                if self.cut:
                    break
                sink.write(data)
                await sink.drain()
        sink.close()

    def sever(self) -> None:
        """Drop every connection and refuse new ones."""
        self.cut = True
        for writer in self._writers:
            writer.close()
        self._writers.clear()

    def heal(self) -> None:
        """Accept connections again."""
        self.cut = False

    async def stop(self) -> None:
        self.sever()
        if self._server is not None:
            self._server.close()
        for task in list(self._pipes):
            task.cancel()
