"""A raw asyncio HTTP/1.1 server for the client benches: every request answered with one fixed JSON body, keep-alive."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

OK_EMPTY = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def serve_fixed(body: bytes, *, hold: Callable[[bytes], Awaitable[bool]] | None = None,
                      backlog: int = 100) -> tuple[asyncio.base_events.Server, int]:
    """Start the server on a free localhost port; returns it and the port. `hold(request_line)` runs before each
    answer and may wait; it returns whether the request gets `body` (else an empty JSON object)."""
    head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                header = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in header.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                full = True if hold is None else await hold(header.split(b"\r\n", 1)[0])
                writer.write(head + body if full else OK_EMPTY)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, backlog=backlog)
    return server, server.sockets[0].getsockname()[1]
