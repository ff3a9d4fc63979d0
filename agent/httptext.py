"""Just enough HTTP/1.1 for Prometheus text, on asyncio streams: a GET server and a GET client.

- :func:`serve_text` answers ``GET <path>`` with the text of a callback,
  404 for another path, 405 for another method, then closes the connection.
  Request heads are bounded (``MAX_HEAD_BYTES``) and must arrive within
  ``HEAD_TIMEOUT_SECONDS``.
- :func:`get_text` fetches a URL (``http://`` only) with one deadline over
  the whole exchange and a bound on the body (``max_bytes``); it understands
  ``Content-Length``, chunked bodies and bodies delimited by the close, which
  covers the Prometheus endpoints of Triton and of ferry's replicas. Every
  failure raises :class:`HttpError`.

Cost: one connection per request; O(body) time and memory.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 16 * 1024
HEAD_TIMEOUT_SECONDS = 5.0
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class HttpError(Exception):
    """A GET failed: unreachable, timed out, not 200, or malformed."""


async def serve_text(host: str, port: int, routes: Mapping[str, Callable[[], str]]) -> tuple[asyncio.Server, int]:
    """Serve ``routes`` (path -> text callback) on ``host:port`` (0 allowed); returns the server and bound port."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_SECONDS)
            method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
            path = rest.split(" ", 1)[0].split("?", 1)[0]
            if method != "GET":
                status, body = "405 Method Not Allowed", "only GET\n"
            elif path in routes:
                status, body = "200 OK", routes[path]()
            else:
                status, body = "404 Not Found", f"no such path {path}; try {', '.join(routes)}\n"
            data = body.encode("utf-8")
            writer.write((f"HTTP/1.1 {status}\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {len(data)}\r\n"
                          "Connection: close\r\n\r\n").encode("latin-1") + data)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, host, port, limit=MAX_HEAD_BYTES)
    return server, int(server.sockets[0].getsockname()[1])


async def get_text(url: str, *, timeout_seconds: float = 2.0, max_bytes: int = 8 * 1024 * 1024) -> str:
    """The body of ``GET url`` as text; raises HttpError on any failure."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise HttpError(f"{url}: only http://host:port/path URLs are supported")
    try:
        fetch = _get(parts.hostname, parts.port or 80, parts.path or "/", max_bytes)
        return await asyncio.wait_for(fetch, timeout_seconds)
    except TimeoutError as exc:
        raise HttpError(f"{url}: timed out after {timeout_seconds} s") from exc
    except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        raise HttpError(f"{url}: {exc}") from exc


async def _get(host: str, port: int, path: str, max_bytes: int) -> str:
    reader, writer = await asyncio.open_connection(host, port, limit=MAX_HEAD_BYTES)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/plain\r\n"
                     "Connection: close\r\n\r\n".encode("latin-1"))
        await writer.drain()
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = head[0].split(" ", 2)
        if len(status) < 2 or status[1] != "200":
            raise ValueError(f"HTTP status {head[0]!r}")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = await _read_chunked(reader, max_bytes)
        elif "content-length" in headers:
            size = int(headers["content-length"])
            if size > max_bytes:
                raise ValueError(f"body of {size} bytes over the limit of {max_bytes}")
            body = await reader.readexactly(size)
        else:
            body = await reader.read(max_bytes + 1)
            while len(body) <= max_bytes and (more := await reader.read(max_bytes + 1 - len(body))):
                body += more
            if len(body) > max_bytes:
                raise ValueError(f"body over the limit of {max_bytes} bytes")
        return body.decode("utf-8", errors="replace")
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _read_chunked(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    body = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
        if size == 0:
            return bytes(body)
        if len(body) + size > max_bytes:
            raise ValueError(f"body over the limit of {max_bytes} bytes")
        body += await reader.readexactly(size)
        await reader.readexactly(2)
