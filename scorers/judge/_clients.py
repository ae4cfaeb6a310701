"""SDK clients, one per (provider, base URL, API key, event loop).

An httpx2 client must not be shared across event loops: ``Scorer.run_sync`` runs on a loop
kept per thread and the worker on its own loop, so each loop gets its own clients. A client
is closed when its loop shuts down its async generators (``asyncio.run`` does this), so
connections are not leaked across test runs.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncGenerator, Callable
from typing import Any

__all__ = ["aclose_clients", "client_for"]

ClientKey = tuple[str, str | None, str | None]
_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[ClientKey, _Entry]] = weakref.WeakKeyDictionary()


class _Entry:
    __slots__ = ("client", "closer")

    def __init__(self, client: Any, closer: AsyncGenerator[None, None]) -> None:
        self.client = client
        self.closer = closer


async def _close_at_loop_shutdown(client: Any) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        await client.close()


async def client_for(key: ClientKey, build: Callable[[], Any]) -> Any:
    """The cached client for ``key`` on the running loop, built with ``build()`` if missing."""
    loop = asyncio.get_running_loop()
    clients = _by_loop.get(loop)
    if clients is None:
        clients = _by_loop[loop] = {}
    entry = clients.get(key)
    if entry is None:
        client = build()
        closer = _close_at_loop_shutdown(client)
        await closer.__anext__()  # registers with the loop's shutdown_asyncgens()
        entry = clients[key] = _Entry(client, closer)
    return entry.client


async def aclose_clients() -> None:
    """Close every judge client of the running loop (call before closing a loop yourself)."""
    clients = _by_loop.pop(asyncio.get_running_loop(), {})
    for entry in clients.values():
        await entry.closer.aclose()
