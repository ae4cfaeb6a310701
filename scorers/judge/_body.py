"""How much of a provider's answer the judge reads: bounded by the call's ``max_tokens``.

The SDKs read a whole response body into memory (and decompress it) before anything looks at
it: a provider or proxy answering 100 MB, or 300 KB of gzip that inflates to 300 MB, took a
worker's memory, and a 500 carrying 20 MB of message held its event loop for seconds while
every copy was scrubbed of credentials. Every built-in model's client reads its responses
through ``cap_response_body`` (an httpx event hook, so the SDK's own transport, proxy and
timeout settings stay as they are): an answer stops being read past the call's cap, counted
after decompression (each gzip or deflate layer undone here, a step at a time), with
``AnswerTooLarge``, which ``translate_sdk_errors`` makes a ``JudgeResponseError`` naming the
size; an answer in another encoding is refused the same way. An error's body is cut at
``ERROR_BODY_BYTES`` (passed on raw when it cannot be decoded), so its status still decides.

Within the cap, a body is parsed only if it holds no more JSON values than the answer could
(``over_values``, ``values_bound``): parsed, each tiny value (``[{},{},…]``) costs some 25 times
its bytes in memory, 400 MB for one call's 16 MiB body.
"""

from __future__ import annotations

import contextlib
import functools
import re
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx2

__all__ = [
    "ACCEPTED_ENCODINGS",
    "ERROR_BODY_BYTES",
    "MAX_CHARS_PER_TOKEN",
    "AnswerTooLarge",
    "answer_cap",
    "cap_response_body",
    "over_values",
    "values_bound",
]

# What the clients ask for: the encodings the hook decodes, bounded (httpx would also offer
# br and zstd where their packages are installed, and inflate those whole).
ACCEPTED_ENCODINGS = {"Accept-Encoding": "gzip, deflate"}

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
# A JSON string, its escapes included: what holds no values, however many commas it quotes.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
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


def values_bound(max_tokens: int) -> int:
    """The most JSON values a body answering within ``max_tokens`` holds: one a character of the
    answer (each is at least one: ``0,``), as ``_JudgeCall._too_long`` bounds it, and one per two
    bytes of the envelope. An answer merely longer than that, of text, is one string however many
    commas it quotes: it is still parsed, its usage counted."""
    return max_tokens * MAX_CHARS_PER_TOKEN + _ENVELOPE_BYTES // 2


def over_values(body: bytes, bound: int) -> bool:
    """Whether ``body`` builds more than ``bound`` values when parsed, keys included. In valid
    JSON every value but the root is a non-empty container's first or follows a comma, and every
    key precedes a colon, so the values are one, plus the commas, the colons and the containers
    not empty, counted outside strings (a count of strings beside the commas took a string in an
    array twice: ``["a","b"]`` was four values, not three). Counted over the whole body first
    (cheap, and never less); gap by gap between strings only when that is over, each string
    matched once where it starts (a search from every quote took quadratic time over
    ``\\"\\"…``), stopping past ``bound``. Each string of valid JSON is a value or a key, so
    more strings than values counted is not JSON: left to json.loads, which stops there."""
    if 1 + sum(body.count(c) for c in _STRUCTURE) <= bound:
        return False
    count = 1
    strings = 0
    pos = 0
    find, match = body.find, _STRING.match
    while True:
        start = find(b'"', pos)
        end = len(body) if start < 0 else start
        gap = body[pos:end]
        count += gap.count(b",") + gap.count(b":")
        if b"{" in gap or b"[" in gap:
            count += _opened(gap)
        if start < 0 or count > bound:
            return count > bound
        string = match(body, start)
        strings += 1
        if string is None or strings > count:  # not JSON: json.loads stops there, having built no more
            return False
        pos = string.end()


def _opened(gap: bytes) -> int:
    """The containers ``gap`` (JSON outside strings) opens but those found empty (``[ ]`` too:
    whitespace is dropped first)."""
    gap = gap.translate(None, _WHITESPACE)
    return gap.count(b"{") + gap.count(b"[") - gap.count(b"{}") - gap.count(b"[]")


_STRUCTURE = (b",", b":", b"{", b"[")
_WHITESPACE = b" \t\n\r"


async def cap_response_body(response: httpx2.Response) -> None:
    """The clients' response hook: read the body through a counter, and decompress it here,
    each layer bounded, rather than in httpx, which would inflate it whole."""
    cap = _cap.get()
    if cap is None:
        return
    header = response.headers.get("content-encoding", "")
    # Listed in the order applied (several headers are joined with commas): undone last first.
    layers = [e for e in (part.strip().lower() for part in header.split(",")) if e and e != "identity"]
    unknown = [e for e in layers if e not in _DECODERS]
    # An error's body is cut, not refused: its status still says what failed (a 5xx stays
    # retryable), and its text reaches the error only that long (in an encoding not read here,
    # its raw bytes: the SDK then reports the status with no message).
    error = response.status_code >= 400
    if unknown and not error:
        import httpx2

        # Not asked for (the clients accept gzip and deflate only), and not to be inflated unbounded.
        raise httpx2.DecodingError(f"the response is encoded as {', '.join(unknown)}, which the judge does not read")
    if layers:
        del response.headers["content-encoding"]
    decoders = [] if unknown else [_DECODERS[e]() for e in reversed(layers)]
    response.stream = _capped_stream()(response.stream, ERROR_BODY_BYTES if error else cap, decoders, error)


# What one decompression step may produce at a time: a layer inflates no further ahead of the count.
_STEP_BYTES = 64 * 1024


class _Deflate:
    """``deflate`` as servers send it: zlib-wrapped, or raw (as httpx reads it too)."""

    def __init__(self) -> None:
        self._inner: Any = zlib.decompressobj()
        self._raw = False
        self._consumed = b""  # the first bytes, until the zlib header (2 bytes) was checked

    @property
    def unconsumed_tail(self) -> bytes:
        return bytes(self._inner.unconsumed_tail)

    def decompress(self, data: bytes, max_length: int) -> bytes:
        checking = not self._raw and len(self._consumed) < 2
        try:
            out = bytes(self._inner.decompress(data, max_length))
        except zlib.error:
            if not checking:
                raise
            # Not zlib-wrapped: raw deflate, read again from its first byte.
            self._inner, self._raw = zlib.decompressobj(-zlib.MAX_WBITS), True
            out = bytes(self._inner.decompress(self._consumed + data, max_length))
        if checking:
            self._consumed += data[: len(data) - len(self._inner.unconsumed_tail)][:2]
        return out

    def flush(self) -> bytes:
        return bytes(self._inner.flush())


_DECODERS: dict[str, Callable[[], Any]] = {
    "gzip": lambda: zlib.decompressobj(zlib.MAX_WBITS | 16),
    "x-gzip": lambda: zlib.decompressobj(zlib.MAX_WBITS | 16),
    "deflate": _Deflate,
}


def _inflate(decoders: list[Any], data: bytes) -> Iterator[bytes]:
    """``data`` through every layer, each step at most ``_STEP_BYTES`` out."""
    if not decoders:
        if data:
            yield data
        return
    first, rest = decoders[0], decoders[1:]
    while data:
        out = first.decompress(data, _STEP_BYTES)
        data = first.unconsumed_tail
        yield from _inflate(rest, out)


def _flushed(decoders: list[Any]) -> Iterator[bytes]:
    for level, decoder in enumerate(decoders):
        yield from _inflate(decoders[level + 1 :], decoder.flush())


@functools.cache
def _capped_stream() -> Callable[[Any, int, list[Any], bool], httpx2.AsyncByteStream]:
    """The stream type, built once httpx2 is loaded (the SDKs load it; this module must not)."""
    import httpx2

    class Capped(httpx2.AsyncByteStream):
        """``inner``'s bytes (decompressed by ``decoders``, outermost first) up to ``cap``: past
        it, the rest is left unread, and ``AnswerTooLarge`` raised unless ``cut`` (an error's
        body: cut there)."""

        def __init__(self, inner: Any, cap: int, decoders: list[Any], cut: bool) -> None:
            self._inner = inner
            self._cap = cap
            self._decoders = decoders
            self._cut = cut
            self._seen = 0

        def _room(self, chunk: bytes) -> bytes:
            room = self._cap - self._seen
            if len(chunk) > room and not self._cut:
                raise AnswerTooLarge(self._cap)
            self._seen += min(len(chunk), room)
            return chunk[:room]

        async def __aiter__(self) -> AsyncIterator[bytes]:
            try:
                async for chunk in self._inner:
                    for out in _inflate(self._decoders, chunk):
                        kept = self._room(out)
                        if kept:
                            yield kept
                        if len(kept) < len(out):
                            return  # cut: the rest of the body is not read
                for out in _flushed(self._decoders):
                    kept = self._room(out)
                    if kept:
                        yield kept
                    if len(kept) < len(out):
                        return
            except zlib.error as exc:
                if self._cut:
                    return  # an error's body: what came decoded is its text, its status the rest
                raise httpx2.DecodingError(f"the compressed response body is corrupt ({exc})") from None

        async def aclose(self) -> None:
            await self._inner.aclose()

    return Capped
