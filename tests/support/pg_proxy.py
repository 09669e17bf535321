"""A TCP forwarder on 127.0.0.1 in front of PostgreSQL that can lose the reply to a COMMIT the server carried out.

Between a client and PostgreSQL as a connection pooler or a failing network would be: bytes pass both ways. Once
armed (`lose_commit_replies`), the next client message that is a COMMIT (a simple `Q` query, or a `P` parse of one)
is forwarded, the server's answer is awaited (the transaction is committed then), and both connections are closed
instead of passing it on: the client sees its connection drop and cannot know the commit landed. Only the wire
protocol's framing is read (a type byte and a length per message, after the untyped startup and SSL requests).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from types import TracebackType
from typing import Self

from shardherd.services.emulators.ports import LOOPBACK

_UNTYPED_REQUESTS = {80877103, 80877104}  # SSLRequest, GSSENCRequest: answered with one byte, then startup again


class LostCommitProxy:
    """Forwards 127.0.0.1:`port` to a PostgreSQL server on loopback; loses the replies to armed COMMITs."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream = (LOOPBACK, upstream_port)
        self._listener = socket.create_server((LOOPBACK, 0))
        self.port: int = self._listener.getsockname()[1]
        self._armed = 0
        self._guard = threading.Lock()
        self.lost = 0  # commits carried out whose reply was dropped
        self._closing = threading.Event()
        self._accepting = threading.Thread(target=self._accept, name="pg-proxy", daemon=True)

    def url(self, server_url: str) -> str:
        """`server_url` (a SQLAlchemy URL of the upstream server) pointed at this proxy instead."""
        return server_url.replace(f":{self._upstream[1]}/", f":{self.port}/")

    def lose_commit_replies(self, count: int = 1) -> None:
        """Lose the replies of the next `count` COMMITs (each carried out by the server first)."""
        with self._guard:
            self._armed += count

    def __enter__(self) -> Self:
        self._accepting.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._closing.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            link = _Link(client, socket.create_connection(self._upstream))
            threading.Thread(target=link.server_side, daemon=True).start()
            threading.Thread(target=self._client_side, args=(link,), daemon=True).start()

    def _client_side(self, link: _Link) -> None:
        """Client to server, message by message; an armed COMMIT's reply never reaches the client."""
        client, server = link.client, link.server
        try:
            while True:
                header = _read(client, 8)  # the untyped startup phase: length, then the request code
                length, code = struct.unpack("!ii", header)
                server.sendall(header + _read(client, length - 8))
                if code not in _UNTYPED_REQUESTS:
                    break
            while True:
                header = _read(client, 5)
                body = _read(client, struct.unpack("!i", header[1:])[0] - 4)
                lose = self._commit(header[:1], body) and self._take_armed()
                if lose:
                    link.swallow.set()  # what the server says from now on goes to nobody
                server.sendall(header + body)
                if lose:
                    if link.answered.wait(10):  # the server answered: the commit is done
                        self.lost += 1
                    return
        except (OSError, ConnectionError):
            pass
        finally:
            link.close()

    @staticmethod
    def _commit(kind: bytes, body: bytes) -> bool:
        text = body.split(b"\0", 2)[1] if kind == b"P" and body.count(b"\0") >= 2 else body if kind == b"Q" else b""
        return text.lstrip().upper().startswith(b"COMMIT")

    def _take_armed(self) -> bool:
        with self._guard:
            if not self._armed:
                return False
            self._armed -= 1
            return True


class _Link:
    """One client connection and its server connection."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.swallow = threading.Event()  # set: the server's bytes are dropped (and `answered` set on the first)
        self.answered = threading.Event()

    def server_side(self) -> None:
        """Server to client, byte for byte, until either side closes or the bytes are swallowed."""
        try:
            while data := self.server.recv(65536):
                if self.swallow.is_set():
                    self.answered.set()
                    return
                self.client.sendall(data)
        except OSError:
            pass
        finally:
            self.answered.set()
            self.close()

    def close(self) -> None:
        """Close both sides (the client sees its connection drop)."""
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):  # already closed by the other side's thread
                sock.shutdown(socket.SHUT_RDWR)  # (unblocks the other thread's recv)
            sock.close()


def _read(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data

