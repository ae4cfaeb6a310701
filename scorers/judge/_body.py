"""How much of a provider's answer the judge reads: bounded by the call's ``max_tokens``.

The SDKs read a whole response body into memory (and decompress it) before anything looks at
it: a provider or proxy answering 100 MB, or 300 KB of gzip that inflates to 300 MB, took a
worker's memory, and a 500 carrying 20 MB of message held its event loop for seconds while
every copy was scrubbed of credentials. Every built-in model's client reads its responses
through ``cap_response_body`` (an httpx event hook, so the SDK's own transport, proxy and
timeout settings stay as they are): an answer stops being read past the call's cap, counted
after decompression, with ``AnswerTooLarge``, which ``translate_sdk_errors`` makes a
``JudgeResponseError`` naming the size; an error's body is cut at ``ERROR_BODY_BYTES``.
"""

from __future__ import annotations

import contextlib
import functools
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx2

__all__ = ["ERROR_BODY_BYTES", "MAX_CHARS_PER_TOKEN", "AnswerTooLarge", "answer_cap", "cap_response_body"]

# An answer longer than this many characters per token of ``max_tokens`` was not cut at the
# limit by the provider (a broken proxy, a custom model): it is refused before it is kept
# (a score keeps an answer up to three times: raw output, output, reason) and stored.
# No tokenizer's tokens average near 64 characters.
MAX_CHARS_PER_TOKEN = 64
# A body holds the answer JSON-escaped (up to 6 bytes a character: \uXXXX) beside its envelope;
# and at least this much is read, so that an answer merely longer than max_tokens allows is read
# whole (its usage counted: it was paid for) and refused by the judge (``_JudgeCall._too_long``).
_ESCAPED = 6
_ENVELOPE_BYTES = 64 * 1024
_MIN_CAP_BYTES = 16 * 1024 * 1024
# An error's body is cut here: no provider's error message is longer, and each copy of it is
# scrubbed of credentials.
ERROR_BODY_BYTES = 64 * 1024

_cap: ContextVar[int | None] = ContextVar("tracescore_judge_answer_cap", default=None)


class AnswerTooLarge(Exception):
    """The response body passed ``cap`` bytes (decompressed) and was not read further."""

    def __init__(self, cap: int) -> None:
        super().__init__(f"the response body is over {cap:,} bytes")
        self.cap = cap


@contextlib.contextmanager
def answer_cap(max_tokens: int) -> Iterator[None]:
    """Bound the bodies read in this context to what ``max_tokens`` can hold."""
    token = _cap.set(max(max_tokens * MAX_CHARS_PER_TOKEN * _ESCAPED + _ENVELOPE_BYTES, _MIN_CAP_BYTES))
    try:
        yield
    finally:
        _cap.reset(token)


async def cap_response_body(response: httpx2.Response) -> None:
    """The clients' response hook: read the body through a counter (and decompress it here,
    bounded, rather than in httpx, which would inflate it whole)."""
    cap = _cap.get()
    if cap is None:
        return
    encoding = response.headers.get("content-encoding", "").strip().lower()
    decoder: Any = None
    if encoding in ("gzip", "x-gzip", "deflate"):
        decoder = zlib.decompressobj(zlib.MAX_WBITS | 32)  # zlib or gzip, told by the header
        del response.headers["content-encoding"]
    # An error's body is cut, not refused: its status still says what failed (a 5xx stays
    # retryable), and its text reaches the error only that long.
    error = response.status_code >= 400
    response.stream = _capped_stream()(response.stream, ERROR_BODY_BYTES if error else cap, decoder, error)


@functools.cache
def _capped_stream() -> Callable[[Any, int, Any, bool], httpx2.AsyncByteStream]:
    """The stream type, built once httpx2 is loaded (the SDKs load it; this module must not)."""
    import httpx2

    class Capped(httpx2.AsyncByteStream):
        """``inner``'s bytes (decompressed by ``decoder``) up to ``cap``: past it, the rest is
        left unread, and ``AnswerTooLarge`` raised unless ``cut`` (an error's body: cut there)."""

        def __init__(self, inner: Any, cap: int, decoder: Any, cut: bool) -> None:
            self._inner = inner
            self._cap = cap
            self._decoder = decoder
            self._cut = cut
            self._seen = 0

        def _room(self, chunk: bytes) -> bytes:
            room = self._cap - self._seen
            if len(chunk) > room and not self._cut:
                raise AnswerTooLarge(self._cap)
            self._seen += min(len(chunk), room)
            return chunk[:room]

        async def __aiter__(self) -> AsyncIterator[bytes]:
            decoder = self._decoder
            async for chunk in self._inner:
                data = chunk
                while data:
                    if decoder is None:
                        out, data = data, b""
                    else:
                        try:
                            # At most one byte past the cap inflated at a time: a bomb stops there.
                            out = decoder.decompress(data, self._cap - self._seen + 1)
                        except zlib.error as exc:
                            raise httpx2.DecodingError(f"the compressed response body is corrupt ({exc})") from None
                        data = decoder.unconsumed_tail
                    kept = self._room(out)
                    if kept:
                        yield kept
                    if self._seen >= self._cap and len(out) > len(kept):
                        return  # cut: the rest of the body is not read
            if decoder is not None and (tail := self._room(decoder.flush())):
                yield tail

        async def aclose(self) -> None:
            await self._inner.aclose()

    return Capped
