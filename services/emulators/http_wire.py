"""Just enough HTTP/1.1 for the limits proxy: read one message from a stream, write one, and a pooled upstream.

Invariants: bodies are framed by Content-Length or chunked transfer coding (both read, only Content-Length
written); header names are kept lower-case; a connection that failed mid-exchange is closed, never reused, and the
exchange is tried once more on a fresh connection (the upstream is a local emulator: a retried call is safe for
the idempotent reads and harmless for the tests' writes, which carry their own retry on errors).
The upstream gets at most `connections` exchanges at once, each on a kept-alive connection; a call beyond them waits
for a free one (first come, first served). A burst of calls opened one new connection each before, and kinesalite,
busy on a loaded host, served a new connection 2-5 s after the proxy connected while kept-alive ones answered in
well under a second (the 256-shard scale run: docs/decisions/0029-kinesis-limits-model.md, session 27 amendment).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from shardherd.services.emulators.ports import LOOPBACK

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Payload Too Large", 500: "Internal Server Error",
            502: "Bad Gateway"}
_HOP_BY_HOP = frozenset({"connection", "content-length", "transfer-encoding", "keep-alive", "host"})


@dataclass(slots=True)
class Message:
    """A request (`start` is 'POST / HTTP/1.1') or a response (`status` set) with lower-case headers."""

    start: str
    headers: dict[str, str]
    body: bytes
    status: int = 0

    @property
    def method(self) -> str:
        """The request method ('' for a response)."""
        return self.start.split(" ", 1)[0]

    @property
    def path(self) -> str:
        """The request target."""
        parts = self.start.split(" ")
        return parts[1] if len(parts) > 1 else "/"


async def read_message(reader: asyncio.StreamReader) -> Message | None:
    """The next message on `reader`, or None at a clean end of stream before one starts."""
    start = await reader.readline()
    if not start:
        return None
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = await _read_chunked(reader)
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    text = start.decode("latin-1").rstrip("\r\n")
    status = int(text.split(" ")[1]) if text.startswith("HTTP/") else 0
    return Message(text, headers, body, status)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while size := int((await reader.readline()).split(b";")[0].strip() or b"0", 16):
        parts.append(await reader.readexactly(size))
        await reader.readline()
    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
        pass  # trailers
    return b"".join(parts)


def response_bytes(status: int, headers: dict[str, str], body: bytes) -> bytes:
    """A keep-alive HTTP/1.1 response with `headers` (hop-by-hop ones dropped) and a Content-Length."""
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    lines += [f"{name}: {value}" for name, value in headers.items() if name not in _HOP_BY_HOP]
    lines += [f"content-length: {len(body)}", "connection: keep-alive", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


UPSTREAM_CONNECTIONS = 32  # exchanges at once with the emulator (kept-alive connections), by default
UPSTREAM_DEADLINE = 30.0  # seconds a call may wait for a free exchange and its answer: past it, the caller gets 502


@dataclass
class Upstream:
    """At most `connections` keep-alive connections to one loopback HTTP server, reused across requests.

    A call that has no answer within `deadline` seconds (waiting for a free exchange included) raises TimeoutError
    and closes the connection it was using, so an emulator that stops answering frees its slots instead of holding
    them for ever.
    """

    port: int
    connections: int = UPSTREAM_CONNECTIONS
    deadline: float = UPSTREAM_DEADLINE
    _idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)
    _slots: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        self._slots = asyncio.Semaphore(self.connections)  # bound to the running loop at its first use

    async def post(self, headers: dict[str, str], body: bytes) -> Message:
        """POST `body` to '/' with the client's `headers` (hop-by-hop ones replaced); the upstream's response.

        Waits for one of the `connections` exchanges to be free first; TimeoutError past `deadline` seconds.
        """
        lines = ["POST / HTTP/1.1", f"host: {LOOPBACK}:{self.port}"]
        lines += [f"{name}: {value}" for name, value in headers.items() if name not in _HOP_BY_HOP]
        lines += [f"content-length: {len(body)}", "", ""]
        request = "\r\n".join(lines).encode("latin-1") + body
        async with asyncio.timeout(self.deadline), self._slots:
            return await self._exchange(request)

    async def _exchange(self, request: bytes) -> Message:
        """Send `request` on an idle connection (a new one if none is idle) and read the answer."""
        while True:
            reused = bool(self._idle)
            reader, writer = self._idle.pop() if reused else await asyncio.open_connection(LOOPBACK, self.port)
            try:
                writer.write(request)
                await writer.drain()
                answer = await read_message(reader)
                if answer is None:
                    raise ConnectionError("upstream closed the connection")
            except asyncio.CancelledError:  # the deadline passed mid-exchange: the connection's state is unknown
                writer.close()
                raise
            except (OSError, asyncio.IncompleteReadError, ValueError):
                writer.close()
                if not reused:
                    raise
                continue
            self._idle.append((reader, writer))
            return answer

    def close(self) -> None:
        """Close every idle connection."""
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()
