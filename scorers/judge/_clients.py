"""SDK clients per (provider, base URL, API key, event loop), leased per request.

An httpx2 client must not be shared across event loops: ``Scorer.run_sync`` runs on a loop
kept per thread and the worker on its own loop, so each loop gets its own clients. Clients
are closed when their loop shuts down its async generators (``asyncio.run`` does this), so
connections are not leaked across loops.

Under load a key gets more than one client: httpcore's connection pool scans every
connection on each request, so one pool of 100 busy connections costs more CPU per call than
several small ones. A request leases the first client with fewer than
``REQUESTS_PER_CLIENT`` requests in flight; a new client (about 20 ms to build) is added only
when all are that busy, up to ``MAX_CLIENTS``.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

__all__ = ["MAX_CLIENTS", "REQUESTS_PER_CLIENT", "aclose_clients", "lease_client"]

REQUESTS_PER_CLIENT = 4
MAX_CLIENTS = 32
ClientKey = tuple[str, str | None, str | None]


class _Pool:
    __slots__ = ("busy", "clients", "closer")

    def __init__(self, closer: AsyncGenerator[None, None], clients: list[Any]) -> None:
        self.clients = clients
        self.busy: list[int] = []
        self.closer = closer


_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[ClientKey, _Pool]] = weakref.WeakKeyDictionary()


async def _close_at_loop_shutdown(clients: list[Any]) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        for client in clients:
            await client.close()


async def _pool(key: ClientKey) -> _Pool:
    loop = asyncio.get_running_loop()
    per_loop = _by_loop.get(loop)
    if per_loop is None:
        per_loop = _by_loop[loop] = {}
    pool = per_loop.get(key)
    if pool is None:
        clients: list[Any] = []
        closer = _close_at_loop_shutdown(clients)
        await closer.__anext__()  # registers with the loop's shutdown_asyncgens()
        pool = per_loop[key] = _Pool(closer, clients)
    return pool


@asynccontextmanager
async def lease_client(key: ClientKey, build: Callable[[], Any]) -> AsyncIterator[Any]:
    """A client for ``key`` on the running loop, held for one request."""
    pool = await _pool(key)
    index = next((i for i, n in enumerate(pool.busy) if n < REQUESTS_PER_CLIENT), None)
    if index is None:
        if len(pool.clients) < MAX_CLIENTS:
            pool.clients.append(build())
            pool.busy.append(0)
            index = len(pool.clients) - 1
        else:
            index = min(range(len(pool.busy)), key=pool.busy.__getitem__)
    pool.busy[index] += 1
    try:
        yield pool.clients[index]
    finally:
        pool.busy[index] -= 1


async def aclose_clients() -> None:
    """Close every judge client of the running loop (call before closing a loop yourself)."""
    per_loop = _by_loop.pop(asyncio.get_running_loop(), {})
    for pool in per_loop.values():
        await pool.closer.aclose()
