"""How much of a provider's answer the judge reads, through the real SDKs over HTTP: a body over
the call's cap (what ``max_tokens`` can hold, 16 MiB at least) is refused after that many bytes,
counted after decompression (a gzip bomb inflates no further), and an error's body is cut at
64 KiB, its status kept.

Before, the SDKs read every body whole: a 40 MB answer held it several times over, 200 KB of
gzip inflated to 200 MB, and a 500 with 20 MB of message took seconds of scrubbing on the
worker's loop before it failed.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import threading
import tracemalloc
import zlib
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from scorers import Judge, ScorerRunError
from scorers.judge import JudgeResponseError, JudgeServerError
from tests._http import QuietHandler, serving
from tests._work import Spy
from tests.judge.helpers import score_scorer

ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": '{"score": 0.5}'}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
}


ANTHROPIC_ANSWER = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "content": [{"type": "text", "text": '{"score": 0.5}'}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 5},
}


class Provider(QuietHandler):
    """Answers every POST with ``reply`` (status, headers, body), counting the requests."""

    reply: ClassVar[tuple[int, dict[str, str], bytes]] = (200, {}, b"")
    requests: ClassVar[list[str]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        with self.lock:
            self.requests.append(self.path)
        status, headers, body = self.reply
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client stopped reading
            self.wfile.write(body)


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Provider]]:
    Provider.requests = []
    with serving(Provider) as url:
        monkeypatch.setenv("OPENAI_BASE_URL", url + "/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-body-cap")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-body-cap")
        yield Provider


def _ask(
    provider: type[Provider], reply: tuple[int, dict[str, str], bytes], model: str = "openai/gpt-4o-mini"
) -> tuple[Any, int]:
    """Run a one-step judge scorer against ``reply``; returns (result or the run's error cause,
    peak bytes allocated while it ran). A first run with a plain answer loads the SDK
    and builds its client, which the measured run then reuses."""
    scorer = score_scorer(Judge(model, timeout=20, max_tokens=256))
    provider.reply = (200, {}, json.dumps(ANTHROPIC_ANSWER if model.startswith("anthropic") else ANSWER).encode())
    assert scorer.run_sync(input="q", output="a").score == 0.5
    provider.requests.clear()
    provider.reply = reply
    tracemalloc.start()
    try:
        outcome: Any = scorer.run_sync(input="q", output="a")
    except ScorerRunError as exc:
        outcome = exc.cause
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return outcome, peak


@pytest.mark.parametrize("model", ["openai/gpt-4o-mini", "anthropic/claude-haiku-4-5"])
def test_an_answer_larger_than_max_tokens_allows_is_refused_unread(provider: type[Provider], model: str) -> None:
    answer = ANTHROPIC_ANSWER if model.startswith("anthropic") else ANSWER
    body = json.dumps({**answer, "pad": "x" * 40_000_000}).encode()
    cause, peak = _ask(provider, (200, {}, body), model)
    assert isinstance(cause, JudgeResponseError), cause
    assert "response body is over" in str(cause)
    assert "more than max_tokens allows" in str(cause)
    assert len(provider.requests) == 1  # not retried: the same request would be paid again
    assert peak < 40_000_000, f"{peak / 1e6:.1f} MB allocated reading a refused answer"


def test_a_gzip_bomb_is_inflated_no_further_than_the_cap(provider: type[Provider]) -> None:
    bomb = gzip.compress(json.dumps({**ANSWER, "pad": "0" * 200_000_000}).encode(), 9)
    assert len(bomb) < 1_000_000
    cause, peak = _ask(provider, (200, {"content-encoding": "gzip"}, bomb))
    assert isinstance(cause, JudgeResponseError), cause
    assert "response body is over" in str(cause)
    assert peak < 40_000_000, f"{peak / 1e6:.1f} MB allocated inflating a refused answer"


def test_a_compressed_answer_within_the_cap_is_read(provider: type[Provider]) -> None:
    result, _ = _ask(provider, (200, {"content-encoding": "gzip"}, gzip.compress(json.dumps(ANSWER).encode())))
    assert result.score == 0.5


def test_a_huge_error_body_is_cut_and_its_status_kept(provider: type[Provider]) -> None:
    error = {"error": {"message": "overloaded " + "y" * 20_000_000, "type": "server_error"}}
    cause, peak = _ask(provider, (500, {}, json.dumps(error).encode()))
    assert isinstance(cause, JudgeServerError), cause
    assert cause.category == "retryable"
    assert len(str(cause)) < 100_000
    assert peak < 2_000_000, f"{peak / 1e6:.1f} MB allocated reading an error"


def test_a_bomb_in_two_gzip_layers_is_inflated_no_further_than_the_cap(provider: type[Provider]) -> None:
    """``Content-Encoding: gzip, gzip`` (or two headers, which httpx joins): the hook matched one
    encoding only and let httpx inflate the rest whole (721 bytes became 600 MB, and the answer
    was accepted). Each layer is undone here, bounded."""
    inner = gzip.compress(json.dumps({**ANSWER, "pad": "0" * 200_000_000}).encode(), 9)
    bomb = gzip.compress(inner, 9)
    cause, peak = _ask(provider, (200, {"content-encoding": "gzip, gzip"}, bomb))
    assert isinstance(cause, JudgeResponseError), cause
    assert "response body is over" in str(cause)
    assert peak < 40_000_000, f"{peak / 1e6:.1f} MB allocated inflating a refused answer"


@pytest.mark.parametrize("wrap", ["zlib", "raw"])
def test_a_deflated_answer_is_read_zlib_wrapped_or_raw(provider: type[Provider], wrap: str) -> None:
    """Servers send ``deflate`` zlib-wrapped or raw; httpx reads both. The hook read zlib only: a
    raw one became a retryable connection error, each retry paid again."""
    body = json.dumps(ANSWER).encode()
    packer = zlib.compressobj(wbits=zlib.MAX_WBITS if wrap == "zlib" else -zlib.MAX_WBITS)
    deflated = packer.compress(body) + packer.flush()
    result, _ = _ask(provider, (200, {"content-encoding": "deflate"}, deflated))
    assert result.score == 0.5


def test_an_encoding_the_judge_does_not_read_is_refused_not_retried(provider: type[Provider]) -> None:
    """The clients ask for gzip and deflate only; a body in another encoding (br, zstd, unknown)
    would be inflated whole by httpx where its package is installed: refused, named, not retried."""
    cause, _ = _ask(provider, (200, {"content-encoding": "br"}, b"\x1b\x00\x00"))
    assert isinstance(cause, JudgeResponseError), cause
    assert "encoded as br" in str(cause)
    assert len(provider.requests) == 1


@pytest.mark.parametrize(("encoding", "body"), [("br", b"\x1b\x00\x00"), ("gzip", b"\x1f\x8b\x08\x00corrupt")])
def test_a_5xx_in_an_encoding_not_read_or_corrupt_keeps_its_status(
    provider: type[Provider], encoding: str, body: bytes
) -> None:
    """An error's body the hook cannot decode is passed on as it is (cut): the SDK reports the
    status. It was refused as a decoding error, a final JudgeResponseError with the status lost,
    where a 503 must stay retryable."""
    cause, _ = _ask(provider, (503, {"content-encoding": encoding}, body))
    assert isinstance(cause, JudgeServerError), cause
    assert (cause.status_code, cause.category) == (503, "retryable")


@pytest.mark.parametrize("layers", [["deflate-raw"], ["deflate-zlib"], ["deflate-raw", "gzip"]])
def test_bodies_read_one_or_two_bytes_at_a_time_decode_whole(layers: list[str]) -> None:
    """A network may deliver a body in pieces of a byte or two: raw deflate was read as zlib
    when its first piece held one byte (too little to check the zlib header), and failed."""
    import asyncio

    from scorers.judge._body import _capped_stream, _Deflate

    text = json.dumps(ANSWER).encode() * 20
    data = text
    decoders: list[Any] = []
    for layer in layers:  # applied in order; the hook undoes the last first
        if layer == "gzip":
            data = gzip.compress(data)
            decoders.insert(0, zlib.decompressobj(zlib.MAX_WBITS | 16))
        else:
            packer = zlib.compressobj(wbits=-zlib.MAX_WBITS if layer == "deflate-raw" else zlib.MAX_WBITS)
            data = packer.compress(data) + packer.flush()
            decoders.insert(0, _Deflate())

    class Pieces:
        async def __aiter__(self) -> Any:
            for i in range(0, len(data), 2):
                yield data[i : i + 1]
                yield data[i + 1 : i + 2]

        async def aclose(self) -> None:
            return None

    async def read() -> bytes:
        stream = _capped_stream()(Pieces(), 10_000_000, decoders, False)
        return b"".join([chunk async for chunk in stream])

    assert asyncio.run(read()) == text


def _values_body(answer: dict[str, Any], fill: bytes, size: int) -> bytes:
    """``answer`` with a ``pad`` array of ``fill`` repeated to about ``size`` bytes."""
    envelope = json.dumps({**answer, "pad": None}).encode()
    return envelope.replace(b"null", b"[" + fill * ((size - len(envelope)) // len(fill)) + b"0]")


@pytest.mark.parametrize("model", ["openai/gpt-4o-mini", "anthropic/claude-haiku-4-5"])
@pytest.mark.parametrize("fill", [b"{},", b"[],", b'"ab",'])
def test_a_body_of_more_json_values_than_an_answer_can_hold_is_refused_unparsed(
    provider: type[Provider], model: str, fill: bytes
) -> None:
    """A body within the cap (16 MiB at least) of millions of tiny values (``[{},{},…]``) cost
    ~25 bytes of memory a byte of body when parsed: 400 MB for one call of 16 MiB, many calls at
    once in a worker. A body holding more JSON values than the call's answer could (one a
    character of what max_tokens allows, beside an envelope) is refused by name before it is
    parsed; it was parsed, and the answer beside it kept."""
    answer = ANTHROPIC_ANSWER if model.startswith("anthropic") else ANSWER
    cause, _ = _ask(provider, (200, {}, _values_body(answer, fill, 1_000_000)), model)
    assert isinstance(cause, JudgeResponseError), cause
    assert "JSON values" in str(cause), cause
    assert "not parsed" in str(cause), cause
    assert len(provider.requests) == 1


def test_a_merely_too_long_answer_full_of_commas_is_still_read_and_its_usage_counted(provider: type[Provider]) -> None:
    """Commas and brackets inside strings build no values: an answer longer than max_tokens
    allows, of prose, is parsed, its tokens counted, and refused as too long (as before)."""
    text = "a, [b], {c}, " * 80_000
    body = json.dumps({**ANSWER, "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})
    cause, _ = _ask(provider, (200, {}, body.encode()))
    assert isinstance(cause, JudgeResponseError), cause
    assert "more than max_tokens=256 allows" in str(cause), cause
    assert cause.execution.usage.total_tokens == 15


def test_counting_a_bodys_values_takes_linear_time_over_an_unterminated_string(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The count first searched for a string from every quote: over an unterminated
    ``"\\"\\"\\"…`` each search ran to the end, quadratic (60 KB: 14 s of CPU; a 400 KB body,
    minutes of the worker's loop). Each string is now matched once, where it starts. Counted, not
    timed: the string pattern is applied once, anchored, to the one string that starts here (a
    search runs inside the regex engine, where no count of lines sees it)."""
    from scorers.judge import _body

    strings = Spy(_body._STRING)
    monkeypatch.setattr(_body, "_STRING", strings)
    # Commas inside the string: the cheap count over the whole body is over the bound, so the
    # count goes gap by gap between strings (with none, it stopped there and no string was matched).
    body = b'["' + b'\\",' * 30_000
    assert not _body.over_values(body, 1_000)
    assert strings.calls == [("match", len(body) - 1)]
