"""A server answer dripped a byte at a time, each byte well inside any client's read timeout:
what a slow proxy or a hostile endpoint does to hold a client that bounds only each read."""

from __future__ import annotations

import threading
from typing import BinaryIO

# A whole acceptance, status line to empty body: 38 bytes, 7.6 s at the pace below.
ACCEPTANCE = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


def drip(out: BinaryIO, stop: threading.Event, data: bytes = ACCEPTANCE, every_s: float = 0.2) -> bool:
    """Write ``data`` to ``out`` a byte every ``every_s``; False when ``stop`` was set first."""
    for at in range(len(data)):
        if stop.wait(every_s):
            return False
        out.write(data[at : at + 1])
        out.flush()
    return True
