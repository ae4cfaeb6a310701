"""TempoSource against a fake Tempo HTTP API: time-range search, fetch by id, retries, resume."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from click.testing import CliRunner
from google.protobuf.json_format import MessageToDict

from tests.backfill._synth import BASE_NS, trace_id, trace_spans
from tests.backfill.faketempo import FakeTempo
from tracing.otlp import decode_otlp_json
from tracing.sources import (
    Malformed,
    Position,
    SourceError,
    SpanBatch,
    TempoSource,
    TraceSource,
    open_source,
    source_from_description,
)
from worker.cli import cli

STEP_NS = 10 * 10**9  # a trace every 10 s
NO_BROKER = {"TRACESCORE_BROKER_URL": ""}  # embedded mode


def _trace(i: int) -> list:  # type: ignore[type-arg]
    children, root = trace_spans(i, step_ns=STEP_NS)
    return decode_otlp_json({"resourceSpans": [{"scopeSpans": [{"spans": [*children, root]}]}]})


@pytest.fixture
def tempo() -> Iterator[FakeTempo]:
    fake = FakeTempo().start()
    for i in range(40):
        fake.add(_trace(i))
    try:
        yield fake
    finally:
        fake.stop()


def _read_ids(source: TraceSource, start: Position | None = None) -> list[str]:
    return [i.spans[0].trace_id for i in source.read(start) if isinstance(i, SpanBatch)]


def test_time_range_reads_each_trace_once_even_when_search_is_full(tempo: FakeTempo) -> None:
    """Windows whose search hits the limit are split, so every trace in range comes exactly once."""
    source = TempoSource(
        tempo.url, since_ns=BASE_NS + 5 * STEP_NS, until_ns=BASE_NS + 35 * STEP_NS, window_s=120, limit=5
    )
    ids = _read_ids(source)
    assert sorted(ids) == sorted(trace_id(i) for i in range(5, 35))
    assert any("limit=5" in r for r in tempo.requests)
    assert source.window_count() == 3
    assert source.fraction_done() == 1.0


def _crowded_second(count: int) -> FakeTempo:
    """A fake Tempo holding ``count`` traces that all start within one second."""
    fake = FakeTempo().start()
    for i in range(count):
        children, root = trace_spans(i, start_ns=BASE_NS + 100_000_000, step_ns=50_000_000)
        fake.add(decode_otlp_json({"resourceSpans": [{"scopeSpans": [{"spans": [*children, root]}]}]}))
    return fake


def test_a_second_holding_more_traces_than_the_search_limit_is_searched_again_larger() -> None:
    """A one-second window still full at the search limit (nothing left to split) is searched
    again with a larger limit until it fits: every trace comes once, nothing is said. It warned
    "some may be missed (raise the search limit)", a limit no option sets, and read 5 of 12."""
    fake = _crowded_second(12)
    try:
        source = TempoSource(fake.url, since_ns=BASE_NS, until_ns=BASE_NS + 4 * 10**9, window_s=4, limit=5)
        items = list(source.read())
        assert [i.reason for i in items if isinstance(i, Malformed)] == []
        ids = [i.spans[0].trace_id for i in items if isinstance(i, SpanBatch)]
        assert sorted(ids) == sorted(trace_id(i) for i in range(12))
        assert any("limit=20" in r for r in fake.requests), fake.requests
    finally:
        fake.stop()


def test_a_tempo_capping_its_search_results_is_said_and_the_traces_found_read() -> None:
    """A Tempo that answers no more than a set number of results however large the limit asked
    (its own cap) leaves a second's traces unlisted: the warning names that cap's setting, and
    the traces it listed are read."""
    fake = _crowded_second(12)
    fake.max_results = 5
    try:
        source = TempoSource(fake.url, since_ns=BASE_NS, until_ns=BASE_NS + 4 * 10**9, window_s=4, limit=5)
        items = list(source.read())
        (warning,) = [i.reason for i in items if isinstance(i, Malformed)]
        assert "more than 5 traces start within second" in warning, warning
        assert "max_result_limit" in warning, warning
        assert len([i for i in items if isinstance(i, SpanBatch)]) == 5
    finally:
        fake.stop()


def test_json_answers_and_stripped_ids(tempo: FakeTempo) -> None:
    """Tempo's JSON form (base64 ids, batches) decodes to the same spans as protobuf."""
    tempo.json_only = True
    source = TempoSource(tempo.url, since_ns=BASE_NS, until_ns=BASE_NS + 3 * STEP_NS)
    batches = [i for i in source.read() if isinstance(i, SpanBatch)]
    assert [len(b.spans) for b in batches] == [3, 3, 3]
    assert {s.name for s in batches[0].spans} == {
        "invoke_agent weather-agent",
        "chat gpt-4o-mini",
        "execute_tool get_weather",
    }


def test_transient_errors_are_retried_and_leading_zero_ids_padded(tempo: FakeTempo) -> None:
    """503s are retried with backoff; an id that search lists without its leading zeros is padded."""
    children, root = trace_spans(2, step_ns=STEP_NS)
    small_id = "0" * 31 + "f"
    del tempo.traces[trace_id(2)]
    tempo.add(
        decode_otlp_json(
            {"resourceSpans": [{"scopeSpans": [{"spans": [{**s, "traceId": small_id} for s in [*children, root]]}]}]}
        )
    )
    tempo.fail_next = 2
    source = TempoSource(tempo.url, since_ns=BASE_NS, until_ns=BASE_NS + 4 * STEP_NS, retries=3)
    items = list(source.read())
    assert not [i for i in items if isinstance(i, Malformed)]
    ids = [i.spans[0].trace_id for i in items if isinstance(i, SpanBatch)]
    assert sorted(ids) == sorted([trace_id(0), trace_id(1), small_id, trace_id(3)])
    assert sum("/api/search" in r for r in tempo.requests) == 3  # two 503s, then the answer


def test_missing_trace_is_malformed(tempo: FakeTempo) -> None:
    """A trace listed by search but not fetchable becomes a Malformed item naming the trace."""
    source = TempoSource(tempo.url, since_ns=BASE_NS, until_ns=BASE_NS + 2 * STEP_NS)
    original = source._fetch
    gone = trace_id(1)

    def fetch(tid: str):  # type: ignore[no-untyped-def]
        return original("f" * 32) if tid == gone else original(tid)

    source._fetch = fetch  # type: ignore[method-assign]
    items = list(source.read())
    (bad,) = [i for i in items if isinstance(i, Malformed)]
    assert "HTTP 404" in bad.reason
    assert bad.position == Position(0, 2)


def test_unreachable_tempo_is_a_source_error() -> None:
    """A backend that never answers raises SourceError after the retries."""
    source = TempoSource("http://127.0.0.1:9", since_ns=BASE_NS, until_ns=BASE_NS + STEP_NS, retries=1)
    with pytest.raises(SourceError, match="unreachable"):
        list(source.read())


def test_an_embedded_backfill_of_an_unreachable_tempo_ends_with_one_error_line() -> None:
    """It went through the crash handler: "error: SourceError: ... (run with --verbose for the
    traceback)" (README audit). Now the summary comes first, then one line, exit 1."""
    result = CliRunner().invoke(
        cli,
        ["backfill", "tempo+http://127.0.0.1:9", "--since", "1h", "--scorers", "tests.backfill.scorers"],
        env={"TRACESCORE_BROKER_URL": ""},
    )
    assert result.exit_code == 1, result.output
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: Tempo at http://127.0.0.1:9 is unreachable"), result.stderr
    assert "the scores above are the part read before it" in last
    assert "--verbose" not in result.stderr


def test_tempo_errors_never_print_the_urls_password(tempo: FakeTempo) -> None:
    """A Tempo URL with credentials: its label, unreachable and HTTP errors show ``***``."""
    secret = "tempo-s3cret-pw"
    down = TempoSource(f"http://bob:{secret}@127.0.0.1:9", since_ns=BASE_NS, until_ns=BASE_NS + STEP_NS, retries=1)
    with pytest.raises(SourceError) as caught:
        list(down.read())
    assert secret not in str(caught.value)
    assert "bob:***@" in str(caught.value)
    assert secret not in down.label()
    with pytest.raises(SourceError) as bad:
        TempoSource(f"ftp://bob:{secret}@host")
    assert secret not in str(bad.value)


def test_resume_position_skips_what_was_read(tempo: FakeTempo) -> None:
    """Reading from (window, index) yields that trace and the rest, as a resumed job needs."""
    source = TempoSource(tempo.url, since_ns=BASE_NS, until_ns=BASE_NS + 24 * STEP_NS, window_s=60)
    everything = [i for i in source.read() if isinstance(i, SpanBatch)]
    middle = everything[10]
    rest = _read_ids(source, middle.position)
    assert rest == [b.spans[0].trace_id for b in everything[10:]]
    assert TempoSource.from_description(source.describe()).describe() == source.describe()


def test_backfill_command_reads_tempo(tempo: FakeTempo) -> None:
    """`tracescore backfill tempo+http://...` with a time range scores the traces in it."""
    since = str((BASE_NS + 10 * STEP_NS) / 1e9)
    until = str((BASE_NS + 20 * STEP_NS) / 1e9)
    result = CliRunner().invoke(
        cli,
        [
            "backfill",
            f"tempo+{tempo.url}",
            "--since",
            since,
            "--until",
            until,
            "--scorers",
            "tests.backfill.scorers",
            "--json",
        ],
        env={"TRACESCORE_BROKER_URL": ""},
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["mode"] == "embedded"
    assert summary["traces_read"] == 10
    assert summary["scored"] + summary["failed"] == 30


def test_tenant_and_auth_headers_come_from_the_environment(tempo: FakeTempo, monkeypatch: pytest.MonkeyPatch) -> None:
    """TRACESCORE_TEMPO_HEADERS (OTLP headers format) reaches Tempo, and is never stored in the job."""
    tempo.required_headers = {"X-Scope-OrgID": "tenant-1", "Authorization": "Basic dTpw"}
    monkeypatch.setenv("TRACESCORE_TEMPO_HEADERS", "X-Scope-OrgID=tenant-1,Authorization=Basic%20dTpw")
    source = open_source([f"tempo+{tempo.url}"], since_ns=BASE_NS, until_ns=BASE_NS + 3 * STEP_NS)
    assert len(_read_ids(source)) == 3
    assert "tenant-1" not in json.dumps(source.describe())
    assert len(_read_ids(source_from_description(source.describe()))) == 3
    monkeypatch.setenv("TRACESCORE_TEMPO_HEADERS", "nonsense")
    with pytest.raises(SourceError, match="TRACESCORE_TEMPO_HEADERS: item 1 \\(of 8 chars\\) is not key=value"):
        open_source([f"tempo+{tempo.url}"])
    monkeypatch.delenv("TRACESCORE_TEMPO_HEADERS")
    with pytest.raises(SourceError, match="HTTP 401"):
        list(open_source([f"tempo+{tempo.url}"], since_ns=BASE_NS, until_ns=BASE_NS + 3 * STEP_NS).read())


def _raw(*chunks: bytes, pause_s: float = 0.0) -> Callable[[BaseHTTPRequestHandler], None]:
    """An answer written as these bytes, with a pause before each chunk."""

    def answer(handler: BaseHTTPRequestHandler) -> None:
        for chunk in chunks:
            time.sleep(pause_s)
            handler.wfile.write(chunk)
            handler.wfile.flush()
        handler.close_connection = True

    return answer


def test_one_hostile_search_entry_or_answer_costs_that_trace_alone(tempo: FakeTempo) -> None:
    """Search entries with an id that is not hex (or a start that is not a number), a garbled
    HTTP answer, a Retry-After of '²', an answer dripped past its deadline (its body, or its
    status line and headers): each ended the whole backfill (InvalidURL, BadStatusLine,
    ValueError) or held it for hours. Now each is that trace's Malformed or a skipped, reported
    entry, and every other trace is read."""
    garbled, retried, dripped, dripped_head = trace_id(1), trace_id(2), trace_id(3), trace_id(7)
    tempo.extra_search_entries = [
        {"traceID": "a b"},
        {"traceID": "zz\ud800"},
        {"traceID": {"x": 1}},
        {"traceID": trace_id(4), "startTimeUnixNano": "²"},
        {"traceID": trace_id(5), "startTimeUnixNano": [1]},
        {"traceID": trace_id(6), "startTimeUnixNano": "9" * 5000},
    ]
    tempo.raw_answers[garbled] = _raw(b"HTTP/1.1 2OO NOT OK \x1b[31m\r\n\r\n")
    tempo.raw_answers[dripped] = _raw(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n",
        *[b" "] * 40,
        pause_s=0.1,
    )
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    tempo.raw_answers[dripped_head] = _raw(*(head[i : i + 1] for i in range(len(head))), pause_s=0.1)

    def busy_once(handler: BaseHTTPRequestHandler) -> None:
        del tempo.raw_answers[retried]  # the retry gets the trace
        _raw(b"HTTP/1.1 503 Busy\r\nRetry-After: \xc2\xb2\r\nContent-Length: 0\r\n\r\n")(handler)

    tempo.raw_answers[retried] = busy_once

    source = TempoSource(tempo.url, since_ns=BASE_NS, until_ns=BASE_NS + 10 * STEP_NS, timeout_s=0.5, retries=2)
    started = time.monotonic()
    items = list(source.read())
    assert time.monotonic() - started < 30
    bad = {i.where: i.reason for i in items if isinstance(i, Malformed)}
    assert bad[f"tempo trace {garbled}"].startswith("cannot fetch: no valid HTTP answer from")
    assert "RemoteProtocolError" in bad[f"tempo trace {garbled}"]
    assert "\x1b" not in repr(bad)
    assert "took over 2 s; not waited for" in bad[f"tempo trace {dripped}"]
    assert "took over 2 s; not waited for" in bad[f"tempo trace {dripped_head}"]
    assert any("3 search result(s) with a trace id that is not hex (or all zeros): skipped" in r for r in bad.values())
    read = {i.spans[0].trace_id for i in items if isinstance(i, SpanBatch)}
    assert read == {trace_id(i) for i in range(10)} - {garbled, dripped, dripped_head}


def test_a_redirect_to_another_origin_is_not_followed_with_the_headers(tempo: FakeTempo) -> None:
    """urllib sent TRACESCORE_TEMPO_HEADERS (a token) to wherever a redirect pointed."""
    elsewhere = FakeTempo().start()
    try:
        tempo.raw_answers[trace_id(1)] = _raw(
            f"HTTP/1.1 302 Found\r\nLocation: {elsewhere.url}/api/traces/{trace_id(1)}\r\n"
            "Content-Length: 0\r\n\r\n".encode()
        )
        source = TempoSource(
            tempo.url,
            since_ns=BASE_NS,
            until_ns=BASE_NS + 3 * STEP_NS,
            headers={"Authorization": "Bearer SECRET-TOKEN"},
        )
        items = list(source.read())
        (bad,) = [i for i in items if isinstance(i, Malformed)]
        assert bad.reason.startswith("cannot fetch: HTTP 302")
        assert elsewhere.requests == []
        assert len([i for i in items if isinstance(i, SpanBatch)]) == 2
    finally:
        elsewhere.stop()


def test_a_redirect_within_tempo_is_followed_with_the_headers(tempo: FakeTempo) -> None:
    """A redirect to the same scheme, host and port is followed (a gateway normalising a path),
    the request's headers with it; the trace is read as if asked for directly."""
    moved = trace_id(1)
    seen: list[str | None] = []

    def redirect_once(handler: BaseHTTPRequestHandler) -> None:
        del tempo.raw_answers[moved]  # the followed request gets the trace
        seen.append(handler.headers.get("Authorization"))
        _raw(
            f"HTTP/1.1 307 Temporary Redirect\r\nLocation: /api/traces/{moved}?again=1\r\n"
            "Content-Length: 0\r\n\r\n".encode()
        )(handler)

    tempo.raw_answers[moved] = redirect_once
    source = TempoSource(
        tempo.url, since_ns=BASE_NS, until_ns=BASE_NS + 3 * STEP_NS, headers={"Authorization": "Bearer TOKEN"}
    )
    items = list(source.read())
    assert not [i for i in items if isinstance(i, Malformed)]
    assert sorted(_read_ids(source)) == sorted(trace_id(i) for i in range(3))
    assert seen == ["Bearer TOKEN"]
    assert f"/api/traces/{moved}?again=1" in tempo.requests


@pytest.mark.parametrize(
    ("name", "value"),
    [("X-Scope-OrgID", "tenant\r\nX-Evil: 1"), ("Bad Name", "value-7"), ("K", "\x00"), ("K", "tenant-€")],
)
def test_a_header_http_cannot_carry_stops_the_source_without_showing_it(name: str, value: str) -> None:
    """A header value with a line break would inject a header of its own into every request
    (urllib refused it only when the request was sent); one httpx cannot encode would fail
    every request."""
    with pytest.raises(SourceError, match="Tempo request header 2 refused") as raised:
        TempoSource("http://127.0.0.1:3200", headers={"Authorization": "Bearer TOKEN", name: value})
    assert "TOKEN" not in str(raised.value)
    assert value not in str(raised.value)


def test_a_redirect_loop_within_tempo_costs_that_trace_alone(tempo: FakeTempo) -> None:
    looping = trace_id(1)
    tempo.raw_answers[looping] = _raw(
        f"HTTP/1.1 302 Found\r\nLocation: /api/traces/{looping}\r\nContent-Length: 0\r\n\r\n".encode()
    )
    source = TempoSource(tempo.url, since_ns=BASE_NS, until_ns=BASE_NS + 3 * STEP_NS, retries=2)
    items = list(source.read())
    (bad,) = [i for i in items if isinstance(i, Malformed)]
    assert bad.reason.startswith("cannot fetch: more than 10 redirects from ")
    assert tempo.requests.count(f"/api/traces/{looping}") == 11  # followed 10 times, not retried
    assert len([i for i in items if isinstance(i, SpanBatch)]) == 2


def test_a_tempo_failing_every_fetch_stops_the_read_before_those_traces(tempo: FakeTempo) -> None:
    """Tempo's search answering while its queriers are down (503 on every fetch): each trace was
    its own Malformed after its retries, one after another, and a job "finished" having read
    nothing, its checkpoint past every trace. Now a failure alone still costs that trace alone,
    but three in a row stop the read (SourceError, a job's resumable stop) before them: a read
    from the last position given fetches them again."""
    unavailable = _raw(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 20\r\n\r\ningester unavailable")
    tempo.raw_answers[trace_id(1)] = unavailable
    for i in range(4, 10):
        tempo.raw_answers[trace_id(i)] = unavailable
    source = TempoSource(tempo.url, since_ns=BASE_NS, until_ns=BASE_NS + 10 * STEP_NS, retries=1)
    items: list[object] = []
    with pytest.raises(SourceError, match=r"failed 3 traces in a row; the last: HTTP 503 from .*ingester unavailable"):
        items.extend(source.read())  # (what came before the error stays in the list)
    assert [i.spans[0].trace_id for i in items if isinstance(i, SpanBatch)] == [trace_id(0), trace_id(2), trace_id(3)]
    (alone,) = [i for i in items if isinstance(i, Malformed)]
    assert alone.where == f"tempo trace {trace_id(1)}"
    assert "HTTP 503" in alone.reason
    last = items[-1]
    assert isinstance(last, SpanBatch)
    assert last.spans[0].trace_id == trace_id(3)

    tempo.raw_answers.clear()  # Tempo is back: the resume reads from the last trace given on
    ids = _read_ids(source, last.position)
    assert ids == [trace_id(i) for i in range(3, 10)]


def test_a_search_listing_a_trace_many_times_has_it_fetched_once(tempo: FakeTempo) -> None:
    """A search answer listing one id 10,000 times (each with another start, or its leading
    zeros kept) had that trace fetched 10,000 times; an all-zero id was fetched (no trace has it)."""
    listed = trace_id(1)
    tempo.extra_search_entries = [
        {"traceID": listed, "startTimeUnixNano": str(BASE_NS + STEP_NS + k)} for k in range(10_000)
    ] + [{"traceID": "0"}, {"traceID": "0" * 32}]
    source = TempoSource(tempo.url, since_ns=BASE_NS, until_ns=BASE_NS + 3 * STEP_NS, limit=100_000)
    items = list(source.read())
    read = sorted(i.spans[0].trace_id for i in items if isinstance(i, SpanBatch))
    assert read == sorted(trace_id(i) for i in range(3))
    assert tempo.requests.count(f"/api/traces/{listed}") == 1
    assert not [r for r in tempo.requests if r.startswith("/api/traces/000")]
    (bad,) = [i for i in items if isinstance(i, Malformed)]
    assert bad.reason == "2 search result(s) with a trace id that is not hex (or all zeros): skipped"


def test_an_answer_of_another_form_says_what_it_was(tempo: FakeTempo) -> None:
    """A body compressed though Accept-Encoding said identity (a proxy's doing), or an HTML page
    with 200, was read as protobuf: "Wire format was corrupt", the trace named twice. Now the
    reason says what came; JSON after a blank line (no Content-Type) is read as JSON."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    gzipped, html, spaced = trace_id(0), trace_id(1), trace_id(2)
    body = gzip.compress(encode_spans(tempo.traces[gzipped]).SerializeToString())
    tempo.raw_answers[gzipped] = _raw(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/protobuf\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body),
        body,
    )
    page = b"<html><body>Sign in</body></html>"
    tempo.raw_answers[html] = _raw(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: %d\r\n\r\n" % len(page),
        page,
    )
    spans = tempo.traces[spaced]
    document = b"\n  " + json.dumps({"batches": MessageToDict(encode_spans(spans))["resourceSpans"]}).encode()
    tempo.raw_answers[spaced] = _raw(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(document), document)
    source = TempoSource(tempo.url, since_ns=BASE_NS, until_ns=BASE_NS + 3 * STEP_NS)
    items = list(source.read())
    bad = {i.where.removeprefix("tempo trace "): i.reason for i in items if isinstance(i, Malformed)}
    assert set(bad) == {gzipped, html}
    assert "came in Content-Encoding gzip, though none was asked for" in bad[gzipped]
    assert bad[html].startswith("not an OTLP protobuf message")
    assert bad[html].endswith(f"(Tempo answered {len(page)} bytes of text/html, read as protobuf)")
    assert "Sign in" not in bad[html]
    assert [i.spans[0].trace_id for i in items if isinstance(i, SpanBatch)] == [spaced]


@pytest.fixture
def reader_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits of the test's thread (the reader's), counted and not taken; the fake Tempo's
    threads sleep as they would."""
    sleeps: list[float] = []
    reader, real_sleep = threading.get_ident(), time.sleep

    def sleep(seconds: float) -> None:
        if threading.get_ident() == reader:
            sleeps.append(seconds)
        else:
            real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    return sleeps


@pytest.mark.parametrize(
    ("retry_after", "waited"),
    [
        (b"7", 7.0),
        (b"3600", 60.0),
        (b"0", 0.0),
        # An HTTP-date (RFC 9110 allows either form; it was read as no Retry-After, backed off
        # with jitter): one decades ahead is the cap; the asctime form too. (One already past:
        # test_a_retry_after_date_already_past_waits_the_backoff.)
        (b"Sun, 06 Nov 2094 08:49:37 GMT", 60.0),
        (b"Sun Nov  6 08:49:37 2094", 60.0),
    ],
)
def test_a_retry_after_is_waited_as_asked_up_to_a_minute(
    tempo: FakeTempo, reader_sleeps: list[float], retry_after: bytes, waited: float
) -> None:
    """The backoff's jitter was applied to Retry-After too: 60 s asked waited 30 to 90 s."""
    slow = trace_id(1)

    def busy_once(handler: BaseHTTPRequestHandler) -> None:
        del tempo.raw_answers[slow]
        _raw(
            b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: "
            + retry_after
            + b"\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        )(handler)

    tempo.raw_answers[slow] = busy_once
    sleeps = reader_sleeps
    source = TempoSource(tempo.url, since_ns=BASE_NS, until_ns=BASE_NS + 3 * STEP_NS)
    assert sorted(_read_ids(source)) == sorted(trace_id(i) for i in range(3))
    assert sleeps == [waited]


@pytest.mark.parametrize(
    "retry_after",
    [b"Sun, 06 Nov 1994 08:49:37 GMT", b"Sunday, 06-Nov-94 08:49:37 GMT", b"Sun Nov  6 08:49:37 1994"],
)
def test_a_retry_after_date_already_past_waits_the_backoff(
    tempo: FakeTempo, reader_sleeps: list[float], retry_after: bytes
) -> None:
    """A 429 or 503 whose Retry-After is a date already past (a clock behind, a cached answer)
    was retried at once, every attempt: a Tempo sending a stale date was hammered with all six
    requests back to back. Such a date asks for no particular wait, so the backoff applies, as in
    the sinks (their delay is never under it). Tempo answers busy twice, then the trace."""
    slow = trace_id(1)
    busy = [2]

    def busy_twice(handler: BaseHTTPRequestHandler) -> None:
        busy[0] -= 1
        if busy[0] == 0:
            del tempo.raw_answers[slow]
        _raw(
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: "
            + retry_after
            + b"\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        )(handler)

    tempo.raw_answers[slow] = busy_twice
    sleeps = reader_sleeps
    source = TempoSource(tempo.url, since_ns=BASE_NS, until_ns=BASE_NS + 3 * STEP_NS)
    assert sorted(_read_ids(source)) == sorted(trace_id(i) for i in range(3))
    assert len(sleeps) == 2, sleeps
    assert 0.1 <= sleeps[0] <= 0.3, sleeps  # the first backoff (0.2 s, jittered by half)
    assert 0.2 <= sleeps[1] <= 0.6, sleeps  # then doubled


def test_an_embedded_backfill_stopped_by_tempo_scores_the_traces_it_had_fetched(
    tempo: FakeTempo, tmp_path: Path
) -> None:
    """Tempo failing three fetches in a row stops the read; the traces fetched before it waited in
    the assembler (for spans a fetched trace never gets) and were dropped unscored, the summary
    saying "traces read 0" of two fetched. An embedded job keeps no state to resume from, so the
    stop ends its input: what it holds is scored and counted before the summary."""
    down = _raw(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 0\r\nContent-Length: 4\r\n\r\ndown")
    for i in range(2, 10):
        tempo.raw_answers[trace_id(i)] = down
    since, until = str(BASE_NS / 1e9), str((BASE_NS + 10 * STEP_NS) / 1e9)
    out = tmp_path / "scores.jsonl"
    command = ["backfill", f"tempo+{tempo.url}", "--since", since, "--until", until, "--json", "--out", str(out)]
    result = CliRunner().invoke(cli, [*command, "--scorers", "tests.backfill.scorers"], env=NO_BROKER)
    assert result.exit_code == 1, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert (summary["status"], summary["traces_read"], summary["runs_enqueued"]) == ("interrupted", 2, 2)
    assert summary["scored"] + summary["failed"] == 6
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["trace_id"] for r in records) == sorted([trace_id(0), trace_id(1)] * 3)
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: Tempo at {tempo.url} failed 3 traces in a row"), last
    assert "the scores above are the part read before it" in last


def test_a_dry_run_stopped_by_tempo_counts_what_it_read_then_names_the_failure(tempo: FakeTempo) -> None:
    """It went through the crash handler ("error: SourceError: ... (run with --verbose ...)"),
    with nothing said of what it had counted."""
    down = _raw(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 0\r\nContent-Length: 4\r\n\r\ndown")
    for i in range(2, 10):
        tempo.raw_answers[trace_id(i)] = down
    since, until = str(BASE_NS / 1e9), str((BASE_NS + 10 * STEP_NS) / 1e9)
    command = ["backfill", f"tempo+{tempo.url}", "--since", since, "--until", until, "--dry-run"]
    result = CliRunner().invoke(cli, [*command, "--scorers", "tests.backfill.scorers"], env=NO_BROKER)
    assert result.exit_code == 1, result.output
    assert "would score 2 runs from 2 traces" in result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: Tempo at {tempo.url} failed 3 traces in a row"), last
    assert last.endswith("the counts above are the part read before it"), last
