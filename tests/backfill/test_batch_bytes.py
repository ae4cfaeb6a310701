"""Broker-mode batches are cut by bytes: one big run never sinks its neighbours.

The driver sizes each request's JSON once; a batch is cut before the run that would take it
past the submitter's ``max_payload_bytes``; a run over the cap alone is a counted, reported reject.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tests.backfill._synth import trace_spans
from tracing.queue import MESSAGE_ENVELOPE_BYTES, ScoreBatch
from tracing.sources import FileSource
from worker.backfill._driver import Backfill
from worker.backfill._progress import ProgressReporter
from worker.backfill._state import BackfillOptions, BackfillState


def big_trace_line(i: int, answer_bytes: int = 0) -> str:
    """One trace as an OTLP JSON line; its answer padded to ``answer_bytes`` when given."""
    children, root = trace_spans(i)
    if answer_bytes:
        answer = ("Paris is lovely. " * (answer_bytes // 17 + 1))[:answer_bytes]
        output = json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": answer}]}])
        chat = children[0]
        chat["attributes"] = [
            a if a["key"] != "gen_ai.output.messages" else {"key": a["key"], "value": {"stringValue": output}}
            for a in chat["attributes"]
        ]
    document = {"resourceSpans": [{"scopeSpans": [{"scope": {"name": "synth"}, "spans": [*children, root]}]}]}
    return json.dumps(document, ensure_ascii=False) + "\n"


class CapturingSubmitter:
    """A broker-like submitter with a message cap that keeps what it was given."""

    mode = "redis"

    def __init__(self, room: int) -> None:
        self.max_payload_bytes = room + MESSAGE_ENVELOPE_BYTES  # ``room`` bytes of requests' JSON
        self.sent: list[tuple[ScoreBatch, list[str]]] = []

    def submit(self, batch: ScoreBatch, requests_json: Sequence[str] | None = None) -> None:
        assert requests_json is not None  # a capped submitter gets the JSON the driver measured
        self.sent.append((batch, list(requests_json)))

    def progress(self, job_id: str) -> dict[str, int]:
        return {}

    def pending(self) -> int:
        return 0

    def close(self) -> None:
        pass


class Messages(ProgressReporter):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        self.lines.append(text)


def _run(path: Path, submitter: CapturingSubmitter, batch_size: int = 200) -> tuple[BackfillState, Messages]:
    source = FileSource([path])
    options = BackfillOptions(
        scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"], batch_size=batch_size
    )
    state = BackfillState(job_id="bf-bytes", source=source.describe(), options=options)
    reporter = Messages()
    return Backfill(source, state, submitter, reporter=reporter).run(), reporter


def test_batches_are_cut_by_bytes_and_an_oversized_run_is_a_counted_reject(tmp_path: Path) -> None:
    """Cap 64 KB: 30 small runs, three 25 KB runs and one 100 KB run. Every batch fits the
    cap, the 100 KB run is rejected (counted, reported with its trace), all others are sent."""
    cap = 64 * 1024
    sizes = {5: 25_000, 6: 25_000, 7: 25_000, 12: 100_000}
    path = tmp_path / "t.jsonl"
    path.write_text("".join(big_trace_line(i, sizes.get(i, 0)) for i in range(34)))
    submitter = CapturingSubmitter(cap)
    state, reporter = _run(path, submitter)

    assert state.counters.runs_rejected == {"too_large": 1}
    assert state.counters.runs_enqueued == 33
    assert state.counters.traces_enqueued == 33
    assert len(submitter.sent) >= 2  # the old driver sent one batch of 34 (~190 KB)
    for batch, encoded in submitter.sent:
        body = ScoreBatch(batch_id=batch.batch_id, requests=batch.requests).model_dump_json()
        assert len(body.encode()) <= cap + 1024
        assert len(json.dumps(json.loads(body), separators=(",", ":"))) <= cap + 1024  # the worker's measure
        assert encoded == [r.model_dump_json() for r in batch.requests]
    sent_traces = [r.trace_id for batch, _ in submitter.sent for r in batch.requests]
    rejected = next(line for line in reporter.lines if "too_large" in line)
    assert "TRACESCORE_MAX_PAYLOAD_BYTES" in rejected
    big_trace = rejected.split()[1]
    assert big_trace not in sent_traces
    assert len(set(sent_traces)) == 33
    assert [b.batch_id for b, _ in submitter.sent] == [f"bf-bytes-{n:06d}" for n in range(len(submitter.sent))]


def test_count_cut_still_applies_under_the_byte_cap(tmp_path: Path) -> None:
    """Small runs: batches of batch_size, as before."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(big_trace_line(i) for i in range(25)))
    submitter = CapturingSubmitter(8 * 2**20)
    _run(path, submitter, batch_size=10)
    assert [len(b.requests) for b, _ in submitter.sent] == [10, 10, 5]
