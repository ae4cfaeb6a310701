"""Producers cut messages by (run, scorer id) pairs as well as by bytes: no batch they send asks
a worker for more than ``MAX_BATCH_PAIRS`` scores or error records, which the workers refuse
(``invalid_payload``), and no run is lost or sent twice on the way, even a trace whose runs alone
ask for more."""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Sequence

from tracing import ScoreBatch, SpanRecord
from tracing.capture._sender import Sender, SenderLimits, Shipment, shipment_size
from tracing.capture._tally import Tally
from tracing.queue import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_BATCH_PAIRS,
    MAX_SCORER_IDS,
    RequestCutter,
    ScoreRequest,
    spans_request,
)

IDS = [f"scorer-{i}" for i in range(MAX_SCORER_IDS)]


def many_runs(salt: str, runs: int) -> tuple[list[SpanRecord], list[str]]:
    """One trace: a workflow span above ``runs`` agent spans, each with a chat span under it;
    the agents are the runs' targets."""
    trace = hashlib.md5(salt.encode()).hexdigest()
    root = SpanRecord(trace_id=trace, span_id=f"{1:016x}", name="workflow")
    spans = [root]
    for i in range(runs):
        agent = SpanRecord(trace_id=trace, span_id=f"{2 * i + 2:016x}", parent_span_id=root.span_id, name="agent.run")
        chat = SpanRecord(trace_id=trace, span_id=f"{2 * i + 3:016x}", parent_span_id=agent.span_id, name="chat")
        spans += [agent, chat]
    return spans, [s.span_id for s in spans if s.name == "agent.run"]


def pairs(requests: Sequence[ScoreRequest]) -> int:
    """What a worker would make of them: each run, each distinct id, once."""
    return sum(len(r.target_span_ids) * len(set(r.scorer_ids)) for r in requests)


def runs_of(requests: Sequence[ScoreRequest]) -> Counter[tuple[str, str]]:
    return Counter((r.trace_id, t) for r in requests for t in r.target_span_ids)


# (runs in the trace, scorer ids): traces whose runs alone ask for more than the bound (2,500 x
# 100, 1,001 x 100), exactly it (1,000 x 100), and smaller ones between them.
FLOOD = [(2_500, 100), (3, 100), (1_001, 100), (999, 100), (7, 40), (1_000, 100), (1, 100), (4_000, 30), (250, 100)]


def test_the_cutter_never_closes_a_batch_past_the_pairs_bound_and_loses_no_run() -> None:
    """A flood of many-run traces x many scorers through the cutter: every message it closes asks
    for at most ``MAX_BATCH_PAIRS`` pairs and validates as the worker reads it (its encoded
    requests), a trace over the bound alone is split by runs (each run's spans travel with it),
    and every run comes out exactly once. The cutter cut by bytes alone: a message of 2,500 runs
    x 100 ids (250,000 pairs, 0.3 MiB) went as one."""
    cutter = RequestCutter(DEFAULT_MAX_PAYLOAD_BYTES)
    sent_in: list[ScoreRequest] = []
    closed = []
    for n, (runs, scorers) in enumerate(FLOOD):
        spans, targets = many_runs(f"flood-{n}", runs)
        request = spans_request(spans, targets, IDS[:scorers])
        sent_in.append(request)
        closed += cutter.add(request)
    closed.append(cutter.take())
    assert sum(len(c.requests) for c in closed) > len(FLOOD)  # (the traces over the bound were split)
    out: list[ScoreRequest] = []
    for chunk in closed:
        assert chunk.requests
        assert chunk.pairs == pairs(chunk.requests) <= MAX_BATCH_PAIRS
        assert chunk.runs == sum(len(r.target_span_ids) for r in chunk.requests)
        # The worker's view: the message as sent, validated.
        body = {"batch_id": "b", "requests": [json.loads(text) for text in chunk.encoded]}
        assert ScoreBatch.model_validate(body).pairs() == chunk.pairs
        out += chunk.requests
    assert runs_of(out) == runs_of(sent_in)
    assert sum(runs for runs, _ in FLOOD) == sum(runs_of(out).values())
    # A run split off keeps its own spans, as the worker reads it from the whole trace.
    whole = {(r.trace_id, t): spans for r in sent_in for t, spans in r.run_spans().items()}
    for request in out:
        for target, spans in request.run_spans().items():
            assert spans == whole[(request.trace_id, target)]
    # Full messages: no more of them than the pairs and the traces split ask for.
    assert len(closed) <= pairs(sent_in) // MAX_BATCH_PAIRS + len(FLOOD)


def test_the_exporter_never_sends_a_batch_past_the_pairs_bound() -> None:
    """An exporter whose batches hold up to 5,000 runs (batch_size), a rule of 100 scorers, and
    traces of up to 2,500 runs: each message its sink gets asks for at most ``MAX_BATCH_PAIRS``
    pairs, and every run is sent once (none dropped)."""
    got: list[ScoreBatch] = []

    class Capped:
        max_payload_bytes = DEFAULT_MAX_PAYLOAD_BYTES

        def send(self, batch: ScoreBatch) -> None:
            raise AssertionError("a capped sink gets encoded requests")

        def send_encoded(self, batch: ScoreBatch, requests_json: Sequence[str]) -> None:
            assert pairs(batch.requests) <= MAX_BATCH_PAIRS
            got.append(batch)

    shipments: list[Shipment] = []
    for n, (runs, scorers) in enumerate(FLOOD[:5]):
        trace, targets = many_runs(f"live-{n}", runs)
        ids = IDS[:scorers]
        own = ScoreRequest.model_construct(spans=trace, target_span_ids=targets, scorer_ids=ids).run_spans()
        for target in targets:
            spans = own[target]
            shipments.append(Shipment(spans, target, ids, shipment_size(spans), trace=trace, runs=runs))
    total = len(shipments)
    tally = Tally()
    sender = Sender(Capped(), SenderLimits(batch_size=5_000, max_batch_bytes=64 * 2**20), tally)
    sender.put(shipments)
    sender.start()
    try:
        assert sender.wait_idle(time.monotonic() + 60)
        assert tally.dropped == {}
        assert sender.counters()["runs_sent"] == total
        sent = runs_of([r for b in got for r in b.requests])
        assert sent == Counter((s.spans[0].trace_id, s.target_span_id) for s in shipments)
        assert max(pairs(b.requests) for b in got) == MAX_BATCH_PAIRS  # full messages, not one run each
    finally:
        sender.stop()
        sender.close(time.monotonic() + 1)
