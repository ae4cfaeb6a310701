"""Errors about bad traces name what was wrong and where, never the agent content they hold.

Their texts reach the worker's and the exporter's logs, score records and dead letters, so each
hostile payload below carries a marker (standing in for a prompt, an answer or a secret) and the
marker must appear in no exception message and no log line, while the message still names the
span and the attribute (or the OTLP field).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog
from opentelemetry.sdk.trace import ReadableSpan

from scorers import create_scorer
from tests.tracing._exporting import Recording
from tests.tracing._spans import Recorder, genai_messages
from tracing import (
    CallbackSink,
    MemoryScoreWriter,
    OtlpDecodeError,
    ScoreBatch,
    ScoreRequest,
    ScoringRule,
    ScoringSpanExporter,
    TraceReadError,
    trace_to_run,
)
from tracing._records import span_record
from tracing.otlp import decode_otlp_json_line
from worker import _scoring
from worker._registry import Registry
from worker._scoring import ScoringDeps, score_batch
from worker.store import MemoryScoreStore

MARKER = "SECRET-7f3a-user-said-this"
OK_INPUT = genai_messages(("user", "hi?"))
OK_OUTPUT = genai_messages(("assistant", "hello"))


def _msgs(*messages: Any) -> str:
    return json.dumps(list(messages))


# (case id, attributes of the "chat m" span, the attribute the error must name, its reason)
_SPAN_CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("bad_json", {"gen_ai.input.messages": "[{" + MARKER}, "gen_ai.input.messages", "bad_json"),
    ("item_not_json", {"gen_ai.input.messages": _msgs(MARKER)}, "gen_ai.input.messages", "bad_json"),
    (
        "unknown_role",
        {"gen_ai.input.messages": _msgs({"role": MARKER, "parts": []})},
        "gen_ai.input.messages",
        "unknown_role",
    ),
    ("message_not_object", {"gen_ai.input.messages": _msgs([MARKER])}, "gen_ai.input.messages", "bad_message"),
    (
        "part_not_object",
        {"gen_ai.input.messages": _msgs({"role": "user", "parts": [[MARKER]]})},
        "gen_ai.input.messages",
        "bad_message",
    ),
    (
        "text_part_without_text",
        {"gen_ai.input.messages": _msgs({"role": "user", "content": [{"type": "text", "text": {"k": MARKER}}]})},
        "gen_ai.input.messages",
        "bad_message",
    ),
    (
        "tool_call_without_name",
        {"gen_ai.output.messages": _msgs({"role": "assistant", "parts": [{"type": "tool_call", "arguments": MARKER}]})},
        "gen_ai.output.messages",
        "bad_message",
    ),
    (
        "part_without_type",
        {"gen_ai.input.messages": _msgs({"role": "user", "content": [{"text": MARKER}]})},
        "gen_ai.input.messages",
        "bad_message",
    ),
    (
        "content_not_parts",
        {"gen_ai.input.messages": _msgs({"role": "user", "content": {"k": MARKER}})},
        "gen_ai.input.messages",
        "bad_message",
    ),
    (
        "tool_calls_not_list",
        {"gen_ai.output.messages": _msgs({"role": "assistant", "content": "x", "tool_calls": MARKER})},
        "gen_ai.output.messages",
        "bad_message",
    ),
    (
        "tool_call_without_function_name",
        {
            "gen_ai.output.messages": _msgs(
                {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"arguments": MARKER}}]}
            )
        },
        "gen_ai.output.messages",
        "bad_message",
    ),
    (
        "system_part_not_object",
        {"gen_ai.system_instructions": json.dumps([[MARKER]])},
        "gen_ai.system_instructions",
        "bad_message",
    ),
    (
        "openinference_role",
        {"llm.input_messages.0.message.role": MARKER, "llm.input_messages.0.message.content": "hi"},
        "llm.input_messages.0.message.role",
        "unknown_role",
    ),
]


def _hostile_trace(
    attrs: dict[str, Any], *, choice_message: str | None = None, name: str = "chat m"
) -> tuple[list[ReadableSpan], str]:
    """One chat span (valid input and output unless ``attrs`` replaces them); its spans and id."""
    rec = Recorder()
    base: dict[str, Any] = {"gen_ai.operation.name": "chat"}
    if not any(k.startswith("llm.") for k in attrs):
        base["gen_ai.input.messages"] = OK_INPUT
    if choice_message is None:
        base["gen_ai.output.messages"] = OK_OUTPUT
    with rec.span(name, {**base, **attrs}) as span:
        if choice_message is not None:
            span.add_event("gen_ai.choice", {"index": 0, "message": choice_message})
        span_id = format(span.get_span_context().span_id, "016x")
    return rec.spans(), span_id


def _all_cases() -> list[tuple[str, list[ReadableSpan], str, str, str]]:
    cases = []
    for name, attrs, attribute, reason in _SPAN_CASES:
        spans, span_id = _hostile_trace(attrs)
        cases.append((name, spans, span_id, attribute, reason))
    # Older GenAI events: a gen_ai.choice whose message is JSON text but not an object.
    spans, span_id = _hostile_trace({}, choice_message=json.dumps(MARKER))
    cases.append(("choice_event_message", spans, span_id, "event gen_ai.choice", "bad_message"))
    return cases


@contextmanager
def _everything_logged() -> Iterator[list[str]]:
    """Every structlog event rendered as the worker's log renders it (structlog's default
    processors: a raised exception with its text), and every stdlib log record, as text."""
    lines: list[str] = []
    renderer = structlog.dev.ConsoleRenderer(colors=False)

    def render(logger: Any, method: str, event: Any) -> Any:
        lines.append(str(renderer(logger, method, dict(event))))
        return event

    handler = _ListHandler(lines)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with structlog.testing.capture_logs(
            [
                structlog.processors.add_log_level,
                structlog.processors.StackInfoRenderer(),
                structlog.dev.set_exc_info,
                render,
            ]
        ):
            yield lines
    finally:
        root.removeHandler(handler)


class _ListHandler(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self._lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self._lines.append(logging.Formatter().format(record))


@pytest.mark.parametrize(("name", "attrs", "attribute", "reason"), _SPAN_CASES, ids=[c[0] for c in _SPAN_CASES])
def test_trace_read_errors_name_the_attribute_not_the_value(
    name: str, attrs: dict[str, Any], attribute: str, reason: str
) -> None:
    """trace_to_run on a hostile span: the error names span and attribute, never the value."""
    spans, span_id = _hostile_trace(attrs)
    with pytest.raises(TraceReadError) as info:
        trace_to_run(spans)
    text = str(info.value)
    assert MARKER not in text, text
    assert info.value.reason == reason
    assert (info.value.span_id, info.value.attribute) == (span_id, attribute)
    assert span_id in text
    assert attribute in text
    assert "chat m" in text


def test_legacy_choice_event_error_names_the_event_not_the_message() -> None:
    spans, span_id = _hostile_trace({}, choice_message=json.dumps(MARKER))
    with pytest.raises(TraceReadError) as info:
        trace_to_run(spans)
    assert MARKER not in str(info.value)
    assert "event gen_ai.choice" in str(info.value)
    assert span_id in str(info.value)
    assert "expected an object" in str(info.value)


def test_errors_say_where_in_the_payload_and_what_shape() -> None:
    """Not quoting the value still leaves the message useful: the index, the field, the shape."""
    spans, _ = _hostile_trace(
        {"gen_ai.input.messages": _msgs({"role": "user", "parts": ["ok"]}, {"role": "user", "parts": ["a", [MARKER]]})}
    )
    with pytest.raises(TraceReadError) as info:
        trace_to_run(spans)
    assert "messages[1]: parts[1]: part is a list of 1 items, expected a string or an object" in str(info.value)
    spans, _ = _hostile_trace({"gen_ai.input.messages": _msgs({"role": MARKER, "parts": []})})
    with pytest.raises(TraceReadError) as info:
        trace_to_run(spans)
    assert f"message role is a string of {len(MARKER)} chars, expected one of" in str(info.value)


_SPAN = {"traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "x"}
_OTLP_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("trace_id", {"traceId": MARKER}, r"spans[0].traceId"),
    ("span_id", {"spanId": MARKER}, r"spans[0].spanId"),
    ("kind", {"kind": MARKER}, r"spans[0].kind"),
    ("status_code", {"status": {"code": MARKER}}, r"spans[0].status.code"),
    ("time", {"startTimeUnixNano": MARKER + "x"}, r"spans[0].startTimeUnixNano"),
    ("int_value", {"attributes": [{"key": "k", "value": {"intValue": MARKER}}]}, "spans[0].attributes[0].value"),
    ("double_value", {"attributes": [{"key": "k", "value": {"doubleValue": MARKER}}]}, "spans[0].attributes[0].value"),
]


@pytest.mark.parametrize(("name", "changes", "field"), _OTLP_CASES, ids=[c[0] for c in _OTLP_CASES])
def test_otlp_decode_errors_name_the_field_not_the_value(name: str, changes: dict[str, Any], field: str) -> None:
    line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{**_SPAN, **changes}]}]}]})
    with pytest.raises(OtlpDecodeError) as info:
        decode_otlp_json_line(line, where="traces.jsonl:3")
    text = str(info.value)
    assert MARKER not in text, text
    assert text.startswith("traces.jsonl:3: "), text
    assert text.endswith(field), text


_length = create_scorer("length", type="agent").generate_score(lambda run: 0.5)
_CASES = _all_cases()


def _score_shipped(requests: list[ScoreRequest]) -> tuple[list[str], MemoryScoreWriter]:
    writer = MemoryScoreWriter()
    deps = ScoringDeps(registry=Registry([_length]), store=MemoryScoreStore(), writer=writer)
    received = [ScoreRequest.model_validate_json(r.model_dump_json()) for r in requests]
    with _everything_logged() as lines:
        asyncio.run(score_batch(ScoreBatch(batch_id="hostile", requests=received), deps))
    return lines, writer


def test_worker_records_and_logs_of_unreadable_traces_hold_no_content() -> None:
    """Through the worker's read + score path: error records name the attribute; no log line and
    no record carries the marker."""
    requests = [
        ScoreRequest(spans=[span_record(s) for s in spans], target_span_ids=[span_id], scorer_ids=["length"])
        for _, spans, span_id, _, _ in _CASES
    ]
    lines, writer = _score_shipped(requests)
    assert len(writer.records) == len(_CASES)
    by_span = {r.span_id: r for r in writer.records}
    for name, _, span_id, attribute, reason in _CASES:
        record = by_span[span_id]
        assert record.error_type == reason, name
        assert attribute in (record.error_message or ""), (name, record.error_message)
        assert MARKER not in record.model_dump_json(), name
    assert any("trace_unreadable" in line for line in lines)
    assert not [line for line in lines if MARKER in line]


@pytest.mark.parametrize(
    "crash",
    [lambda: KeyError(MARKER), lambda: ValueError(f"the answer was {MARKER}")],
    ids=["key_error", "value_error"],
)
def test_worker_log_of_a_reader_crash_holds_no_content(
    monkeypatch: pytest.MonkeyPatch, crash: Callable[[], Exception]
) -> None:
    """A bug in the reader whose exception text quotes the run: logged by type and stack only,
    and the error record says which exception, not its text."""

    def broken(spans: Any, target_span_id: str | None = None, **kw: Any) -> Any:
        raise crash()

    spans, span_id = _hostile_trace({})
    monkeypatch.setattr(_scoring, "trace_to_run", broken)
    lines, writer = _score_shipped(
        [ScoreRequest(spans=[span_record(s) for s in spans], target_span_ids=[span_id], scorer_ids=["length"])]
    )
    (record,) = writer.records
    assert record.error_type == "read_failed"
    assert type(crash()).__name__ in (record.error_message or "")
    assert (record.error_message or "").startswith(f"span {span_id}: reading the trace failed")  # not "span None"
    assert MARKER not in (record.error_message or "")
    crashed = [line for line in lines if "trace_read_crashed" in line]
    assert crashed
    assert "broken" in crashed[0]
    assert not [line for line in lines if MARKER in line]


def test_worker_log_of_a_scorer_crash_holds_no_content(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scorer bug outside its steps whose exception quotes the answer: the log has its type and
    stack only; the score record keeps the text for whoever reads that scorer's scores."""
    scorer = create_scorer("leaky", type="agent").generate_score(lambda run: 0.5)

    async def leaky_run(self: Any, *, output: Any, **kw: Any) -> Any:
        raise ValueError(f"cannot score {output[0].content.parts[-1].text}")

    monkeypatch.setattr(type(scorer), "run", leaky_run)  # a Scorer is immutable; this test's only one
    spans, span_id = _hostile_trace({"gen_ai.output.messages": genai_messages(("assistant", MARKER))})
    writer = MemoryScoreWriter()
    deps = ScoringDeps(registry=Registry([scorer]), store=MemoryScoreStore(), writer=writer)
    request = ScoreRequest(spans=[span_record(s) for s in spans], target_span_ids=[span_id], scorer_ids=["leaky"])
    with _everything_logged() as lines:
        asyncio.run(score_batch(ScoreBatch(batch_id="leaky", requests=[request]), deps))
    (record,) = writer.records
    assert record.error_type == "ValueError"
    assert MARKER in (record.error_message or "")
    crashed = [line for line in lines if "scorer_crashed" in line]
    assert crashed
    assert "leaky_run" in crashed[0]
    assert not [line for line in lines if MARKER in line]


def test_exporter_logs_of_unreadable_traces_hold_no_content() -> None:
    """The exporter reads each hostile trace in the application: counted, logged without content."""
    exporter = ScoringSpanExporter(
        # A rule with a filter has the exporter read each run in the application.
        [ScoringRule(["length"], filter=lambda run: True)],
        CallbackSink(Recording()),
        grace_s=0,
    )
    try:
        with _everything_logged() as lines:
            for _, spans, _, _, _ in _CASES:
                exporter.export(spans)
            assert exporter.force_flush(5000)
    finally:
        exporter.shutdown(2000)
    assert sum(1 for line in lines if "trace_unreadable" in line) == len(_CASES)
    assert not [line for line in lines if MARKER in line]


def test_backfill_log_of_a_planner_crash_holds_no_content(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planner bug whose exception quotes the trace is counted, and logged by type and stack."""
    from click.testing import CliRunner

    from worker.backfill import _driver
    from worker.cli import cli

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError(MARKER)

    monkeypatch.setattr(_driver, "plan_part", broken)
    examples = Path(__file__).resolve().parents[2] / "examples" / "traces"
    with _everything_logged() as lines:
        result = CliRunner().invoke(
            cli,
            ["backfill", str(examples), "--scorers", "tests.backfill.scorers", "--json"],
            env={"TRACESCORE_BROKER_URL": ""},
        )
    assert result.stdout.strip(), result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["traces_unreadable"] == {"KeyError": 300}
    assert any("backfill_plan_failed" in line for line in lines)
    assert not any(MARKER in line for line in lines)


def test_logs_of_unreadable_traces_show_a_span_name_only_as_a_plain_id() -> None:
    """A span's name is the application's text: one that carries a prompt (a framework naming a
    span after its input) was logged as it is by both readers' ``trace_unreadable``. It is shown
    there as a plain id shows, else as its digest; the span id still says which span."""
    spans, span_id = _hostile_trace({"gen_ai.input.messages": "[{"}, name=f"answer to: {MARKER}")
    plain, plain_id = _hostile_trace({"gen_ai.input.messages": "[{"}, name="chat.gpt-4o")
    request = [
        ScoreRequest(spans=[span_record(s) for s in trace], target_span_ids=[target], scorer_ids=["length"])
        for trace, target in ((spans, span_id), (plain, plain_id))
    ]
    worker_lines, _ = _score_shipped(request)
    exporter = ScoringSpanExporter(
        [ScoringRule(["length"], filter=lambda run: True)], CallbackSink(Recording()), grace_s=0
    )
    try:
        with _everything_logged() as exporter_lines:
            exporter.export(spans)
            exporter.export(plain)
            assert exporter.force_flush(5000)
    finally:
        exporter.shutdown(2000)
    for lines in (worker_lines, exporter_lines):
        unreadable = [line for line in lines if "trace_unreadable" in line]
        assert len(unreadable) == 2, lines
        assert not [line for line in lines if MARKER in line]
        hidden = next(line for line in unreadable if span_id in line)
        assert "span_name=sha256:" in hidden, hidden
        shown = next(line for line in unreadable if plain_id in line)
        assert "span_name=chat.gpt-4o" in shown, shown
