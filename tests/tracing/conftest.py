"""After every tracing test: each trace it recorded reads the same from shipped span records.

The exporter's default path ships ``SpanRecord``s (only the attributes and events the
transform reads, through JSON) and the worker reads them; this checks, on every trace the
transform tests build (each producer format, malformed ones too), that nothing the transform
needs was left out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan

from tests.tracing import _spans
from tracing import ScoreRequest, SpanRecord, TraceReadError, find_targets, trace_to_run
from tracing._records import span_record


def shipped(spans: Sequence[ReadableSpan], target: str) -> list[SpanRecord]:
    """The spans as the worker gets them: compact records, through the JSON message."""
    records = [span_record(s) for s in spans]
    request = ScoreRequest(spans=records, target_span_ids=[target], scorer_ids=["s"])
    received = ScoreRequest.model_validate_json(request.model_dump_json())
    assert received.spans is not None
    return received.spans


def _outcome(spans: Sequence[Any], target: str | None) -> Any:
    try:
        return trace_to_run(spans, target).model_dump(mode="json")
    except TraceReadError as exc:
        return ("error", exc.reason, exc.span_id, exc.attribute, str(exc))


def check_same_from_records(spans: Sequence[ReadableSpan]) -> int:
    """Compare every target of every trace in ``spans``; returns how many were compared."""
    by_trace: dict[int, list[ReadableSpan]] = defaultdict(list)
    for span in spans:
        assert span.context is not None
        by_trace[span.context.trace_id].append(span)
    compared = 0
    for trace in by_trace.values():
        targets = find_targets(trace) or [format(trace[0].context.span_id, "016x")]  # type: ignore[union-attr]
        for target in targets:
            assert _outcome(shipped(trace, target), target) == _outcome(trace, target), target
            compared += 1
    return compared


@pytest.fixture(autouse=True)
def _same_from_records() -> Iterator[None]:
    _spans.CREATED.clear()
    yield
    recorders, _spans.CREATED[:] = list(_spans.CREATED), []
    for rec in recorders:
        spans = rec.spans()
        if spans:
            check_same_from_records(spans)
