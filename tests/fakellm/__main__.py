"""``python -m tests.fakellm --port 0 --latency-ms 200``: serve until killed.

Prints ``fakellm listening on http://127.0.0.1:PORT`` (one line, flushed) once bound.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from tests.fakellm._server import FakeLLMServer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.fakellm", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="delay before every answer")
    parser.add_argument("--no-record", action="store_true", help="keep counts only, not request bodies (benchmarks)")
    args = parser.parse_args(argv)
    server = FakeLLMServer(args.host, args.port, latency_ms=args.latency_ms)
    server.record_bodies(not args.no_record)

    def ready() -> None:
        print(f"fakellm listening on {server.url}", flush=True)

    async def run() -> None:
        await server.serve_forever(ready)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


if __name__ == "__main__":
    main()
