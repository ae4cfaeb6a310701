"""A fake OpenAI + Anthropic HTTP server on asyncio streams (HTTP/1.1, keep-alive).

It runs on its own event loop in a background thread (``FakeLLMServer.start()``), so sync
tests, async tests and ``Scorer.run_sync`` can all talk to it, or as a process
(``python -m tests.fakellm``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from tests.fakellm._schema import instance_for
from tests.fakellm._script import RecordedRequest, Reply, Rule

__all__ = ["DEFAULT_CACHE_MIN_TOKENS", "FakeLLMServer"]

DEFAULT_CACHE_MIN_TOKENS = 1024

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    409: "Conflict",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    529: "Overloaded",
}
_OPENAI_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_denied",
    404: "not_found_error",
    429: "rate_limit_exceeded",
}
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


class FakeLLMServer:
    """Fake LLM endpoints: ``POST /v1/chat/completions`` (OpenAI) and ``POST /v1/messages``
    (Anthropic), plus ``GET /_fake/stats`` and ``POST /_fake/reset`` / ``/_fake/script``.

    Script it with :meth:`script` (a FIFO queue) and :meth:`rule` (standing rules); anything
    unmatched gets :meth:`Reply.auto`. Every request is recorded in :attr:`requests`.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, latency_ms: float = 0.0) -> None:
        self.host = host
        self.port = port
        self.latency_ms = latency_ms
        self._lock = threading.Lock()
        self._queue: list[Rule] = []
        self._rules: list[Rule] = []
        self._requests: list[RecordedRequest] = []
        self._record_bodies = True
        self._total = 0
        self._per_second: Counter[int] = Counter()
        self._per_model: Counter[str] = Counter()
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._hang_release: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        # Prompt caching, as the providers do it: a prefix (here: the system text) seen before
        # is served from the cache — OpenAI by itself, Anthropic where ``cache_control`` marks
        # it — once it is at least this many tokens (both providers' minimum is 1024).
        self.cache_min_tokens = DEFAULT_CACHE_MIN_TOKENS
        self._cached_prefixes: set[tuple[str, str, str]] = set()

    # --- lifecycle ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        """What ``OPENAI_BASE_URL`` must be (the OpenAI SDK appends ``/chat/completions``)."""
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """What ``ANTHROPIC_BASE_URL`` must be (the Anthropic SDK appends ``/v1/messages``)."""
        return self.url

    def start(self) -> FakeLLMServer:
        """Serve on a background thread; returns once the port is bound."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._bind())
            except BaseException as exc:  # reported to the starting thread
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._shutdown())
                loop.close()

        self._thread = threading.Thread(target=main, name="fakellm", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def serve_forever(self, on_ready: Callable[[], None] | None = None) -> None:
        """Run on the current loop (the process entry point uses this)."""
        self._loop = asyncio.get_running_loop()
        await self._bind()
        assert self._server is not None
        if on_ready is not None:
            on_ready()
        try:
            await self._server.serve_forever()
        finally:
            await self._shutdown()

    async def _bind(self) -> None:
        self._hang_release = asyncio.Event()
        self._server = await asyncio.start_server(
            self._handle, self.host, self.port, backlog=1024, limit=4 * 1024 * 1024
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        if self._hang_release is not None:
            self._hang_release.set()
        for w in list(self._writers):
            w.close()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    # --- scripting ----------------------------------------------------------------------

    def script(self, *replies: Reply | Rule) -> None:
        """Queue replies (FIFO). A queued :class:`Rule` is used by the first request it matches."""
        with self._lock:
            for r in replies:
                self._queue.append(r if isinstance(r, Rule) else Rule(reply=r))

    def rule(
        self,
        reply: Reply,
        *,
        provider: str | None = None,
        model: str | None = None,
        system_contains: str | None = None,
        user_contains: str | None = None,
        match: Any = None,
        times: int | None = None,
    ) -> Rule:
        """A standing rule, checked in order after the queue; first match answers."""
        rule = Rule(reply, provider, model, system_contains, user_contains, match, times)
        with self._lock:
            self._rules.append(rule)
        return rule

    def reset(self) -> None:
        """Forget the script, the rules, the recorded requests; latency back to 0."""
        with self._lock:
            self._queue.clear()
            self._rules.clear()
            self._requests.clear()
            self._total = 0
            self._per_second.clear()
            self._per_model.clear()
            self._cached_prefixes.clear()
            self.cache_min_tokens = DEFAULT_CACHE_MIN_TOKENS
            self.latency_ms = 0.0
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._release_hangs)

    def _release_hangs(self) -> None:
        # Hanging replies wait on the current event; later ones wait on a fresh one.
        if self._hang_release is not None:
            self._hang_release.set()
        self._hang_release = asyncio.Event()

    def record_bodies(self, on: bool) -> None:
        """Turn request recording off for long benchmarks (counts are still kept)."""
        self._record_bodies = on

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def pending(self) -> int:
        """Queued script entries not used yet."""
        with self._lock:
            return len(self._queue)

    def count(self, *, model: str | None = None, provider: str | None = None) -> int:
        return sum(
            1
            for r in self.requests
            if (model is None or r.model == model) and (provider is None or r.provider == provider)
        )

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "total": self._total,
                "per_model": dict(self._per_model),
                "per_second": {str(k): v for k, v in sorted(self._per_second.items())},
                "pending_script": len(self._queue),
            }

    def _choose(self, req: RecordedRequest) -> Reply:
        with self._lock:
            for i, queued in enumerate(self._queue):
                if queued.matches(req):
                    if queued.times is None or queued.times <= 1:
                        del self._queue[i]
                    else:
                        queued.times -= 1
                    return queued.reply
            for rule in self._rules:
                if rule.matches(req) and (rule.times is None or rule.times > 0):
                    if rule.times is not None:
                        rule.times -= 1
                    return rule.reply
        return Reply.auto()

    # --- HTTP ---------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = ([*lines[0].split(" ", 2), "", ""])[:3]
                headers: dict[str, str] = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                length = int(headers.get("content-length", "0") or 0)
                raw = await reader.readexactly(length) if length else b""
                keep = await self._dispatch(method, path.split("?", 1)[0], headers, raw, writer)
                if not keep or headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _dispatch(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        raw: bytes,
        writer: asyncio.StreamWriter,
    ) -> bool:
        if path.startswith("/_fake/"):
            return await self._control(method, path, raw, writer)
        if method != "POST" or not (path.endswith(("/chat/completions", "/messages"))):
            await _send(writer, 404, {"error": {"message": f"no route {method} {path}"}}, {})
            return True
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            await _send(writer, 400, {"error": {"message": "body is not JSON"}}, {})
            return True
        now = time.time()
        req = RecordedRequest.parse(path, body, headers, now)
        req.request_id = f"req_{secrets.token_hex(12)}"
        reply = self._choose(req)
        req.reply = reply
        with self._lock:
            self._total += 1
            self._per_second[int(now)] += 1
            self._per_model[req.model] += 1
            if self._record_bodies:
                self._requests.append(req)
        latency = reply.latency_ms if reply.latency_ms is not None else self.latency_ms
        if latency > 0:
            await asyncio.sleep(latency / 1000)
        return await self._respond(req, reply, writer)

    async def _respond(self, req: RecordedRequest, reply: Reply, writer: asyncio.StreamWriter) -> bool:
        id_header = "request-id" if req.provider == "anthropic" else "x-request-id"
        headers = {id_header: req.request_id, **reply.headers}
        if reply.kind == "hang":
            assert self._hang_release is not None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._hang_release.wait(), reply.hang_s)
            return False
        if reply.kind == "drop":
            return False
        if reply.kind == "malformed_body":
            payload = json.dumps(self._success(req, reply)).encode()
            await _send_raw(writer, 200, payload[: len(payload) // 2], headers)
            return True
        if reply.kind == "raw":
            await _send_raw(writer, reply.status, (reply.content or "").encode(reply.encoding), headers)
            return True
        if reply.kind == "error":
            await _send(writer, reply.status, self._error(req, reply), headers)
            return True
        await _send(writer, 200, self._success(req, reply), headers)
        return True

    def _error(self, req: RecordedRequest, reply: Reply) -> dict[str, Any]:
        if req.provider == "anthropic":
            kind = reply.error_type or _ANTHROPIC_ERROR_TYPES.get(reply.status, "api_error")
            return {
                "type": "error",
                "error": {"type": kind, "message": reply.message or "fake error"},
                "request_id": req.request_id,
            }
        kind = reply.error_type or _OPENAI_ERROR_TYPES.get(reply.status, "server_error")
        return {
            "error": {
                "message": reply.message or "fake error",
                "type": kind,
                "param": None,
                "code": reply.error_code,
            }
        }

    def _refusal(self, req: RecordedRequest, reply: Reply) -> dict[str, Any]:
        usage_in, usage_out = max(1, (len(req.system) + len(req.user_text)) // 4), 5
        if req.provider == "anthropic":
            return {
                "id": f"msg_{secrets.token_hex(12)}",
                "type": "message",
                "role": "assistant",
                "model": req.model,
                "content": [],
                "stop_reason": "refusal",
                "stop_sequence": None,
                "usage": {"input_tokens": usage_in, "output_tokens": usage_out},
            }
        return {
            "id": f"chatcmpl-{secrets.token_hex(12)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": None, "refusal": reply.content},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {"prompt_tokens": usage_in, "completion_tokens": usage_out, "total_tokens": usage_in + usage_out},
        }

    def _success(self, req: RecordedRequest, reply: Reply) -> dict[str, Any]:
        if reply.kind == "refusal":
            return self._refusal(req, reply)
        structured: Any = None
        text: str | None = None
        if reply.kind == "text":
            text = reply.content or ""
        elif reply.kind == "json":
            structured = reply.data
        elif req.schema is not None or req.structured is not None:
            structured = instance_for(req.schema or {"type": "object", "properties": {}})
        else:
            text = "This is the fake judge's answer."
        prompt_tokens = reply.input_tokens
        if prompt_tokens is None:
            prompt_tokens = max(1, (len(req.system) + len(req.user_text)) // 4)
        cached, written = self._prompt_cache(req, prompt_tokens)
        if req.provider == "anthropic":
            if structured is not None and req.tool_name is not None:
                content: list[dict[str, Any]] = [
                    {
                        "type": "tool_use",
                        "id": f"toolu_{secrets.token_hex(12)}",
                        "name": req.tool_name,
                        "input": structured,
                    }
                ]
                stop = "tool_use"
                out_len = len(json.dumps(structured))
            else:
                body_text = text if text is not None else json.dumps(structured)
                content = [{"type": "text", "text": body_text}]
                stop = "end_turn"
                out_len = len(body_text)
            return {
                "id": f"msg_{secrets.token_hex(12)}",
                "type": "message",
                "role": "assistant",
                "model": req.model,
                "content": content,
                "stop_reason": reply.finish or stop,
                "stop_sequence": None,
                "usage": {
                    # Anthropic counts the cache reads and writes apart from input_tokens.
                    "input_tokens": prompt_tokens - cached - written,
                    "output_tokens": reply.output_tokens or max(1, out_len // 4),
                    "cache_read_input_tokens": cached,
                    "cache_creation_input_tokens": written,
                },
            }
        body_text = text if text is not None else json.dumps(structured)
        completion_tokens = reply.output_tokens or max(1, len(body_text) // 4)
        return {
            "id": f"chatcmpl-{secrets.token_hex(12)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model,
            "system_fingerprint": "fp_fakellm",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": body_text, "refusal": None},
                    "finish_reason": reply.finish or "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }

    def _prompt_cache(self, req: RecordedRequest, prompt_tokens: int) -> tuple[int, int]:
        """(tokens read from the prompt cache, tokens written to it) for this request."""
        prefix = min(prompt_tokens, len(req.system) // 4)
        if prefix < max(1, self.cache_min_tokens):
            return 0, 0
        if req.provider == "anthropic":
            system = req.body.get("system")
            marked = isinstance(system, list) and any(isinstance(b, dict) and b.get("cache_control") for b in system)
            if not marked:
                return 0, 0
        key = (req.provider, req.model, req.system)
        with self._lock:
            seen = key in self._cached_prefixes
            self._cached_prefixes.add(key)
        if seen:
            return prefix, 0
        # OpenAI caches for free on the way; Anthropic bills the first write.
        return 0, prefix if req.provider == "anthropic" else 0

    async def _control(self, method: str, path: str, raw: bytes, writer: asyncio.StreamWriter) -> bool:
        if method == "GET" and path == "/_fake/stats":
            await _send(writer, 200, self.stats(), {})
        elif method == "POST" and path == "/_fake/reset":
            self.reset()
            await _send(writer, 200, {"ok": True}, {})
        elif method == "POST" and path == "/_fake/script":
            data = json.loads(raw or b"[]")
            self.script(*(Reply.from_json(d) for d in _as_list(data)))
            await _send(writer, 200, {"ok": True, "pending": self.pending}, {})
        elif method == "POST" and path == "/_fake/latency":
            self.latency_ms = float(json.loads(raw or b"0"))
            await _send(writer, 200, {"ok": True}, {})
        else:
            await _send(writer, 404, {"error": f"unknown control {method} {path}"}, {})
        return True


def _as_list(data: Any) -> Iterable[dict[str, Any]]:
    return data if isinstance(data, list) else [data]


async def _send(writer: asyncio.StreamWriter, status: int, body: Any, headers: dict[str, str]) -> None:
    await _send_raw(writer, status, json.dumps(body).encode(), headers)


async def _send_raw(writer: asyncio.StreamWriter, status: int, payload: bytes, headers: dict[str, str]) -> None:
    head = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    all_headers = {
        "content-type": "application/json",
        "content-length": str(len(payload)),
        **headers,
    }
    head += [f"{k}: {v}" for k, v in all_headers.items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload)
    await writer.drain()
