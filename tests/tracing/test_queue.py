"""tracing.queue: one request shape, one wire format, one publisher (exporter and backfill alike),
backpressure as a wrapper; backfill ships span records and the worker alone reads runs."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tests._redis import RedisServer
from tests._work import assert_linear
from tests.backfill._doubles import CapturingSubmitter
from tests.backfill._synth import trace_spans
from tests.tracing._spans import Recorder, agent_trace
from tests.worker._batches import batch as make_batch
from tracing import CelerySink, SpanRecord, trace_to_run, trace_to_runs
from tracing._records import span_record
from tracing.otlp import decode_otlp_json, decode_otlp_records
from tracing.queue import PLAIN_ID_RULE, Backpressure, ScoreBatch, ScoreRequest, plain_id, request_json, task_message
from tracing.read import loop_guard
from tracing.sources import FileSource
from worker.backfill._driver import Backfill
from worker.backfill._state import BackfillOptions, BackfillState

QUEUE = "tracescore-queue-test"
DB = 4


def test_a_request_has_one_shape_and_refuses_a_read_run() -> None:
    """A request is span records + target; the old ``run`` shape fails validation naming it."""
    rec = Recorder()
    agent_trace(rec)
    run = trace_to_run(rec.spans())
    with pytest.raises(ValidationError, match="run"):
        ScoreRequest.model_validate({"run": run.model_dump(mode="json"), "scorer_ids": ["s"]})
    records = [span_record(s) for s in rec.spans()]
    request = ScoreRequest(spans=records, target_span_ids=[run.identity.span_id], scorer_ids=["s"])
    assert trace_to_run(request.spans, request.target_span_ids[0]) == run


def test_a_request_whose_runs_nest_is_refused_naming_them_at_a_linear_cost() -> None:
    """A target under another target (no producer plans one: targets are top-level) made every
    run read the others' spans again: 2,000 of them nested one under the next (430 KB) cost a
    worker 77 s. Validation refuses it, naming the first such target and the one above it; a
    chain of 20,000 is refused as fast as flat targets are read (no walk up per target): counted,
    not timed, it runs about twice the lines a chain of 10,000 does (tests/_work.py)."""

    def nested(length: int) -> list[SpanRecord]:
        return [
            SpanRecord(
                trace_id="a" * 32, span_id=f"{i + 1:016x}", name="agent.run", parent_span_id=f"{i:016x}" if i else None
            )
            for i in range(length)
        ]

    def refused(spans: list[SpanRecord]) -> None:
        with pytest.raises(ValidationError, match="is under"):
            ScoreRequest(spans=spans, target_span_ids=[s.span_id for s in spans], scorer_ids=["s"])

    chain = nested(20_000)
    with pytest.raises(ValidationError, match=f"target_span_ids: {2:016x} is under {1:016x}"):
        ScoreRequest(spans=chain[:2], target_span_ids=[chain[1].span_id, chain[0].span_id], scorer_ids=["s"])
    assert_linear(nested, refused, 20_000)
    # Siblings under one parent that is no target are runs of their own, each with its spans.
    flat = [chain[0], *(replace(s, parent_span_id=chain[0].span_id) for s in chain[1:4])]
    request = ScoreRequest(spans=flat, target_span_ids=[s.span_id for s in flat[1:]], scorer_ids=["s"])
    assert request.run_spans() == {s.span_id: [s] for s in flat[1:]}


@pytest.mark.parametrize(
    ("span_change", "request_change"),
    [({"start_time_ns": -1}, {}), ({"end_time_ns": 2**64}, {}), ({}, {"enqueued_at": 1e300})],
)
def test_times_otlp_cannot_carry_do_not_cost_a_message(
    span_change: dict[str, int], request_change: dict[str, float]
) -> None:
    """An app's exporter not yet upgraded can still ship a span timed outside OTLP's fixed64:
    the message is read (refusing it lost every run sharing it); the OTLP sink writes the score
    at a time it can carry (tests/tracing/test_sinks_faults_otlp.py)."""
    span = {"trace_id": "ab" * 16, "span_id": "cd" * 8, "name": "x", **span_change}
    request = {"spans": [span], "target_span_ids": ["cd" * 8], "scorer_ids": ["s"], **request_change}
    other = {**request, "spans": [{**span, "trace_id": "ef" * 16, "start_time_ns": 5, "end_time_ns": 6}]}
    assert len(ScoreBatch.model_validate({"batch_id": "b", "requests": [request, other]}).requests) == 2


# The request's fields in the release before requests carried several runs (commit 5acc6a0),
# whose model refused any other key: what a one-run request must still be written as.
PREVIOUS_RELEASE_FIELDS = ["spans", "target_span_id", "scorer_ids", "source", "job_id", "enqueued_at"]


def test_a_one_run_request_is_written_as_the_previous_release_reads_it() -> None:
    """Producers may be upgraded before the workers: a request of one run keeps the one-run
    shape on the wire (``target_span_id``: a string); several runs need the list. Both read
    back as the same request."""
    rec = Recorder()
    agent_trace(rec)
    records = [span_record(s) for s in rec.spans()]
    one = ScoreRequest(
        spans=records, target_span_ids=[records[-1].span_id], scorer_ids=["s"], source="backfill", job_id="j"
    )
    wire = json.loads(request_json(one))
    assert list(wire) == PREVIOUS_RELEASE_FIELDS  # that release's field order too
    assert wire["target_span_id"] == records[-1].span_id
    assert wire == {**one.model_dump(mode="json", exclude={"target_span_ids"}), "target_span_id": records[-1].span_id}
    assert ScoreRequest.model_validate_json(request_json(one)) == one
    # (two runs side by side: a run's target is never inside another run)
    apart = [replace(records[0], parent_span_id=None), *records[1:]]
    two = ScoreRequest(spans=apart, target_span_ids=[records[-1].span_id, records[0].span_id], scorer_ids=["s"])
    wire = json.loads(request_json(two))
    assert wire["target_span_ids"] == [records[-1].span_id, records[0].span_id]
    assert "target_span_id" not in wire
    assert ScoreRequest.model_validate(wire) == two
    batch = ScoreBatch(batch_id="b", requests=[one, two])  # what publishers send
    body = json.loads(task_message(batch, "test").body)
    assert [sorted(r) for r in body[0][0]["requests"]] == [
        sorted(PREVIOUS_RELEASE_FIELDS),
        sorted(json.loads(request_json(two))),
    ]
    assert ScoreBatch.model_validate(body[0][0]) == batch
    with pytest.raises(ValidationError, match="target_span_id"):  # the old name holds a string only
        ScoreRequest.model_validate({**json.loads(request_json(one)), "target_span_id": ["x"]})


def _document(spans: list[dict[str, Any]], service: str = "my-app") -> dict[str, Any]:
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": {"name": "app"}, "spans": spans}]}]}


def test_backfill_ships_span_records_and_the_worker_reads_the_same_runs(tmp_path: Path) -> None:
    """Backfill requests carry span records (no run read on the sending side); reading them as
    the worker does gives exactly the runs the transform reads from the stored trace."""
    documents = [_document([*trace_spans(i)[0], trace_spans(i)[1]]) for i in range(6)]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in documents))
    options = BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"])
    source = FileSource([path])
    state = BackfillState(job_id="bf-records", source=source.describe(), options=options)
    submitter = CapturingSubmitter(8 * 2**20)
    Backfill(source, state, submitter).run()
    requests = [r for b, _ in submitter.sent for r in b.requests]
    assert len(requests) == 6
    for request in requests:
        received = ScoreRequest.model_validate_json(request.model_dump_json())  # what a worker gets
        assert (received.source, received.job_id) == ("backfill", "bf-records")
        document = next(
            d for d in documents if d["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] == received.trace_id
        )
        (expected,) = trace_to_runs(decode_otlp_json(document))
        assert trace_to_run(received.spans, received.target_span_ids[0]) == expected


def test_decoded_records_are_what_the_exporter_ships() -> None:
    """OTLP JSON decodes straight to the records the exporter builds from the SDK spans."""
    children, root = trace_spans(3)
    root["attributes"].append({"key": "http.url", "value": {"kvlistValue": {"values": []}}})  # unread
    document = _document([*children, root])
    assert decode_otlp_records(document) == [span_record(s) for s in decode_otlp_json(document)]


def test_loop_guard_over_records() -> None:
    """tracescore's own service or a judge root excludes the trace; a judge child its subtree."""
    children, root = trace_spans(1)
    assert loop_guard(decode_otlp_records(_document([*children, root]))) == frozenset()
    assert loop_guard(decode_otlp_records(_document([*children, root], service="tracescore-worker"))) is None
    judge = {"key": "tracescore.role", "value": {"stringValue": "judge"}}
    children[0]["attributes"].append(judge)
    assert loop_guard(decode_otlp_records(_document([*children, root]))) == {children[0]["spanId"]}
    root["attributes"].append(judge)
    assert loop_guard(decode_otlp_records(_document([*children, root]))) is None


class _Publisher:
    max_payload_bytes = 2**20

    def __init__(self) -> None:
        self.published: list[str] = []

    def publish(self, batch: ScoreBatch, requests_json: Sequence[str] | None = None) -> None:
        self.published.append(batch.batch_id)

    def close(self) -> None:
        pass


def test_backpressure_waits_for_the_low_water_mark() -> None:
    """Above high water a publish waits until the queue drains to low water, and not before."""
    depth = [10]
    inner = _Publisher()
    held = Backpressure(inner, lambda: depth[0], high_water=5, low_water=2, poll_s=0.01)
    seen: list[int] = []
    held.on_wait = seen.append  # (the backfill's progress line while it waits)
    done = threading.Event()
    thread = threading.Thread(target=lambda: (held.publish(make_batch(range(1), ["s"], batch_id="b")), done.set()))
    thread.start()
    assert not done.wait(0.2)
    depth[0] = 3  # below high water but above low water: still held
    assert not done.wait(0.2)
    depth[0] = 2
    assert done.wait(5)
    thread.join()
    assert inner.published == ["b"]
    assert held.throttled_s > 0.3
    assert {10, 3} <= set(seen)
    assert 2 not in seen


def test_backpressure_wait_ends_on_a_stop() -> None:
    held = Backpressure(_Publisher(), lambda: 100, high_water=5, poll_s=0.01)
    held.should_stop = lambda: True
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        held.publish(make_batch(range(1), ["s"]))
    assert time.monotonic() - started < 5


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the redis-server binary")
def test_exporter_sink_and_backfill_submitter_publish_the_same_message(redis_server: RedisServer) -> None:
    """CelerySink and RedisSubmitter go through one publisher: same body, same headers."""
    from worker._settings import load_settings
    from worker.backfill._submit import RedisSubmitter

    client = redis_server.client(DB)
    client.flushdb()
    batch = make_batch(range(3), ["length"], batch_id="same")
    sink = CelerySink(redis_server.url(DB), queue=QUEUE)
    sink.send(batch)
    sink.close()
    submitter = RedisSubmitter(load_settings(broker_url=redis_server.url(DB), queue=QUEUE))
    submitter.submit(batch)
    submitter.close()
    raw = [json.loads(m) for m in reversed(client.lrange(QUEUE, 0, -1))]
    assert len(raw) == 2
    expected = task_message(batch, "x")
    import base64

    bodies = [
        base64.b64decode(m["body"]).decode() if m["properties"].get("body_encoding") == "base64" else m["body"]
        for m in raw
    ]
    assert bodies == [expected.body, expected.body]
    headers = [{k: v for k, v in m["headers"].items() if k not in ("id", "root_id", "origin")} for m in raw]
    want = {k: v for k, v in expected.headers.items() if k not in ("id", "root_id", "origin")}
    assert headers == [want, want]
    assert [m["headers"]["origin"].split("@")[0] for m in raw] == ["tracescore-exporter", "tracescore-backfill"]


def test_a_batch_id_that_is_not_a_plain_id_is_refused_by_the_producer() -> None:
    """The workers refuse a message whose batch id is not a plain id (they and Celery log it), not
    retryable: the producer is told, when it builds the message, not in a letter of theirs."""
    for batch_id in ("b 1", "b-1\n", "x" * 129, ""):
        assert not plain_id(batch_id)
        with pytest.raises(ValueError, match="plain id"):
            task_message(ScoreBatch.model_construct(batch_id=batch_id, requests=[]), "test")
    assert plain_id("bf-20261206-104202-ab7e0a-000001/3")
    task_message(ScoreBatch.model_construct(batch_id="a" * 128, requests=[]), "test")


def test_the_words_for_a_plain_id_say_what_plain_id_accepts() -> None:
    """``PLAIN_ID_RULE`` is what the producer's error and the workers' refusals tell an operator:
    read back as a rule (length bounds, ASCII letters and digits, the marks listed), it accepts
    exactly what ``plain_id`` does, character by character and at the bounds."""
    said = re.fullmatch(r"([0-9]+)–([0-9]+) ASCII letters, digits and (\S+)", PLAIN_ID_RULE)
    assert said is not None, PLAIN_ID_RULE
    low, high, marks = int(said[1]), int(said[2]), said[3]
    for code in range(0x20, 0x2FF):
        char = chr(code)
        told = (char.isascii() and char.isalnum()) or char in marks
        assert plain_id(char) == told, repr(char)
    assert (plain_id("a" * low), plain_id("a" * high)) == (True, True)
    assert (plain_id("a" * (low - 1)), plain_id("a" * (high + 1))) == (False, False)


def test_a_request_naming_more_scorers_than_any_registry_holds_is_refused_at_once() -> None:
    """A request's scorer ids had no bound: a worker makes one error record per run for each id
    it does not have, so a 6.7 MiB message listing 1,000,000 distinct 4-character ids beside
    3 runs asked for 3,000,000 records (measured 100,000 ids: 300,000 records, 214 MiB of them,
    19 s and 1.6 GB on a worker), each stored and sent to every sink. More than
    ``MAX_SCORER_IDS`` is refused, naming the field and the bound, before the ids are read
    one by one; the bound itself, duplicates (scored once, as producers of earlier releases
    sent them) and any text as an id still validate."""
    from tracing.queue import MAX_SCORER_IDS

    record = make_batch(range(1), ["s"]).requests[0]
    fields: dict[str, Any] = {"spans": record.spans, "target_span_ids": record.target_span_ids}
    ids = [f"u{i}" for i in range(1_000_000)]
    with pytest.raises(ValidationError, match=f"scorer_ids\n.*at most {MAX_SCORER_IDS} items") as refused:
        ScoreRequest(**fields, scorer_ids=ids)
    assert [e["type"] for e in refused.value.errors()] == ["too_long"]
    # Refused by its length before any id is read: a million ids that are no text make one
    # error, not one each.
    with pytest.raises(ValidationError) as unread:
        ScoreRequest(**fields, scorer_ids=[5] * 1_000_000)
    assert [e["type"] for e in unread.value.errors()] == ["too_long"]
    with pytest.raises(ValidationError, match="scorer_ids"):
        ScoreRequest(**fields, scorer_ids=ids[: MAX_SCORER_IDS + 1])
    assert len(ScoreRequest(**fields, scorer_ids=ids[:MAX_SCORER_IDS]).scorer_ids) == MAX_SCORER_IDS
    assert ScoreRequest(**fields, scorer_ids=["s", "s", "t", "s"]).scorer_ids == ["s", "s", "t", "s"]
    assert ScoreRequest(**fields, scorer_ids=["x" * 1_000_000, "", "\ud800"]).scorer_ids[1] == ""
    for odd in ([5], [None], [["s"]], "s", [{"id": "s"}]):
        with pytest.raises(ValidationError, match="scorer_ids"):
            ScoreRequest(**fields, scorer_ids=odd)


def test_a_batch_refuses_unknown_fields_as_its_requests_do() -> None:
    """The envelope ignored fields it does not know while its requests refuse theirs: a message
    carrying a field no release writes (a producer's mistake, or megabytes of anything beside
    valid requests) was scored with the field silently dropped. No release's producer ever
    wrote more than ``batch_id`` and ``requests``, so refusing it breaks no upgrade path; a
    field a later release adds needs the workers upgraded first, as a request's field does."""
    sent = json.loads(make_batch(range(1), ["s"]).model_dump_json())
    assert set(sent) == {"batch_id", "requests"}
    ScoreBatch.model_validate(sent)
    for extra in ({"priority": 1}, {"batch_id_v2": "x"}, {"junk": "x" * 1_000_000}, {"requests_extra": []}):
        with pytest.raises(ValidationError, match=f"{next(iter(extra))}\n.*Extra inputs are not permitted"):
            ScoreBatch.model_validate({**sent, **extra})


def _runs_by_ancestry(spans: list[SpanRecord], targets: list[str]) -> dict[str, list[SpanRecord]] | None:
    """What ``run_spans`` gives, the slow and plain way: each span goes to the target met walking
    up its parents (None: a target under another, or a span two targets reach)."""
    parents: dict[str, set[str]] = {}
    for s in spans:
        if s.parent_span_id is not None:
            parents.setdefault(s.span_id, set()).add(s.parent_span_id)
    wanted = set(targets)

    def owners(span_id: str) -> set[str]:
        found, seen, todo = set(), set(), [span_id]
        while todo:
            here = todo.pop()
            if here in seen:
                continue
            seen.add(here)
            if here in wanted:
                found.add(here)
                if here != span_id:
                    continue  # (a target's own ancestors are not its run's)
            todo.extend(parents.get(here, ()))
        return found

    if any(owners(t) != {t} for t in targets):
        return None
    groups: dict[str, list[SpanRecord]] = {t: [] for t in targets}
    for s in spans:
        mine = owners(s.span_id)
        if len(mine) > 1:
            return None
        if mine:
            groups[mine.pop()].append(s)
    return groups


def test_the_runs_of_a_request_are_each_targets_descendants_whatever_the_links() -> None:
    """``run_spans`` (and validation, which refuses nested targets) against a plain reference
    over random forests: duplicate span ids, parents missing, cycles, a target under another."""
    import random

    rng = random.Random(7)
    checked = refused = 0
    for _ in range(600):
        n = rng.randint(2, 40)
        ids = [f"{rng.randrange(n * 4):016x}" for _ in range(n)]  # a few duplicates among them
        spans: list[SpanRecord] = []
        for i, span_id in enumerate(ids):
            roll = rng.random()
            if roll < 0.3 or i == 0:
                parent = None
            elif roll < 0.9:
                parent = rng.choice(ids[:i])  # a tree
            elif roll < 0.95:
                parent = rng.choice(ids)  # perhaps a cycle
            else:
                parent = f"{n * 5:016x}"  # not among the spans
            spans.append(SpanRecord(trace_id="a" * 32, span_id=span_id, name="agent.run", parent_span_id=parent))
        targets = list(dict.fromkeys(rng.sample(ids, rng.randint(2, min(6, n)))))
        if len(targets) < 2:
            continue
        expected = _runs_by_ancestry(spans, targets)
        if expected is None:
            with pytest.raises(ValidationError, match="is under"):
                ScoreRequest(spans=spans, target_span_ids=targets, scorer_ids=["s"])
            refused += 1
            continue
        request = ScoreRequest(spans=spans, target_span_ids=targets, scorer_ids=["s"])
        assert request.run_spans() == expected
        checked += 1
    assert checked > 100
    assert refused > 100


def _flat_trace(runs: int, salt: str) -> tuple[list[SpanRecord], list[str]]:
    """One trace of ``runs`` top-level spans, each a run's target."""
    trace = hashlib.md5(salt.encode()).hexdigest()
    spans = [SpanRecord(trace_id=trace, span_id=f"{i + 1:016x}", name="agent.run") for i in range(runs)]
    return spans, [s.span_id for s in spans]


def test_a_batch_asking_more_run_scorer_pairs_than_the_bound_is_refused_naming_it() -> None:
    """Each (run, scorer id) pair a message asks for is a score or an error record, each stored
    and sent to every sink: an 8 MiB message held ~31,000 minimal runs x 100 unknown ids, ~3.1M
    records from one message (1,000 x 100 took a worker 5.6 s). Past ``MAX_BATCH_PAIRS``, summed
    over the requests (an id named twice counts once: it is scored once), the batch is refused
    naming the bound, before a span is read; at the bound it validates, as dicts (the worker's
    input) and as models."""
    from tracing.queue import MAX_BATCH_PAIRS, MAX_SCORER_IDS

    per_request = MAX_BATCH_PAIRS // MAX_SCORER_IDS // 2
    ids = [f"s{i}" for i in range(MAX_SCORER_IDS)]
    requests = []
    for salt in ("a", "b"):
        spans, targets = _flat_trace(per_request, salt)
        requests.append(ScoreRequest(spans=spans, target_span_ids=targets, scorer_ids=ids))
    at_bound = ScoreBatch(batch_id="pairs", requests=requests)
    assert at_bound.pairs() == MAX_BATCH_PAIRS == sum(r.pairs() for r in requests)
    sent = json.loads(at_bound.model_dump_json())
    assert ScoreBatch.model_validate(sent).pairs() == MAX_BATCH_PAIRS
    # An id named twice is one pair a run: 2 x 500 runs x 99 ids (and one named twice), and
    # 10 x 100 more, is the bound (counted by names, 101,000).
    twice = [{**r, "scorer_ids": [*ids[:-1], "s0"]} for r in sent["requests"]]
    spans, targets = _flat_trace(MAX_BATCH_PAIRS // MAX_SCORER_IDS // 100, "c")
    ten = ScoreRequest(spans=spans, target_span_ids=targets, scorer_ids=ids)
    doubled = {**sent, "requests": [*twice, json.loads(request_json(ten))]}
    assert ScoreBatch.model_validate(doubled).pairs() == MAX_BATCH_PAIRS

    one_more = make_batch(range(1), ["s"]).requests[0]
    for over in (
        {**sent, "requests": [*sent["requests"], json.loads(one_more.model_dump_json())]},
        # (the previous release's one-run shape counts its run too)
        {**sent, "requests": [*sent["requests"], json.loads(request_json(one_more))]},
    ):
        with pytest.raises(ValidationError, match=f"{MAX_BATCH_PAIRS + 1:,} .*at most {MAX_BATCH_PAIRS:,}") as refused:
            ScoreBatch.model_validate(over)
        assert len(refused.value.errors()) == 1
    with pytest.raises(ValidationError, match=f"at most {MAX_BATCH_PAIRS:,}"):
        ScoreBatch(batch_id="pairs", requests=[*requests, one_more])
    # Refused before the spans are read: a flood of runs whose spans are no records is one
    # error, the bound's.
    flood = {
        "batch_id": "flood",
        "requests": [{"spans": [5] * 10, "target_span_ids": [f"{i:016x}" for i in range(10_000)], "scorer_ids": ids}],
    }
    with pytest.raises(ValidationError, match=f"1,000,000 .*at most {MAX_BATCH_PAIRS:,}") as unread:
        ScoreBatch.model_validate(flood)
    assert len(unread.value.errors()) == 1
