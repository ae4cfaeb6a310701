"""A TCP proxy in front of a test's Redis that kills it at one chosen moment: after Redis ran a
command (and, fsynced on every write, has it on disk) and before its reply reaches the client.
The reply is dropped with the connection, as when Redis dies there, and the client, reconnecting,
sends the command again (the window tests/worker/test_redis_restart.py hits with a monkeypatched
client, here for real worker processes)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

from tests._redis import RedisServer


class ReplyCut:
    """Listens on a free loopback port and forwards to ``redis``. Once ``arm()``ed, the first
    request ``chosen`` (its bytes as sent) is let through, and its reply (one Redis did not refuse)
    is dropped: ``on_cut`` runs (say, stop Redis) and the client's connection is closed."""

    def __init__(self, redis: RedisServer, chosen: Callable[[bytes], bool], on_cut: Callable[[], None]) -> None:
        self.redis, self.chosen, self.on_cut = redis, chosen, on_cut
        self.armed, self.cut = threading.Event(), threading.Event()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, db: int = 0) -> str:
        return f"redis://:{self.redis.password}@127.0.0.1:{self.port}/{db}"

    def arm(self) -> None:
        self.armed.set()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.redis.port), timeout=2)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            waiting = threading.Event()  # this connection sent the marked command
            threading.Thread(target=self._requests, args=(client, server, waiting), daemon=True).start()
            threading.Thread(target=self._replies, args=(server, client, waiting), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket, waiting: threading.Event) -> None:
        try:
            while data := client.recv(65536):
                if self.armed.is_set() and not self.cut.is_set() and self.chosen(data):
                    waiting.set()
                server.sendall(data)
        except OSError:
            pass
        finally:
            _close(client, server)

    def _replies(self, server: socket.socket, client: socket.socket, waiting: threading.Event) -> None:
        try:
            while data := server.recv(65536):
                if waiting.is_set() and data.startswith(b"-"):  # (-NOSCRIPT: nothing ran yet)
                    waiting.clear()
                elif waiting.is_set():
                    with self._lock:
                        if not self.cut.is_set():
                            self.cut.set()
                            self.on_cut()
                            return
                client.sendall(data)
        except OSError:
            pass
        finally:
            _close(client, server)


def _close(*sockets: socket.socket) -> None:
    for s in sockets:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        s.close()
