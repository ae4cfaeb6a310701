"""A job enqueues each run (trace id, target span id) once, and every reject is counted.

A run sent twice in one job left a Redis-mode job waiting forever: its expected scores counted
both copies, the workers one. Copies came from a file given twice, a batch of spans a collector
wrote twice (past the assembly window), and a resume reading again past its checkpoint. Spans
of a trace already read that come past the window (a collector's copy, a straggler) are late
spans now, counted and not read (tests/backfill/test_late_spans.py), so no run of theirs is sent.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests._redis import RedisServer
from tests.backfill._doubles import CapturingSubmitter, redis_job_store
from tests.backfill._synth import BASE_NS, _line, trace_id, trace_spans, write_otlp_files
from tests.backfill.faketempo import FakeTempo, encode_spans
from tests.backfill.test_batch_bytes import _three_agent_line
from tracing.otlp import decode_otlp_json
from tracing.queue import request_json
from tracing.sources import FileSource, Malformed, Position, SpanBatch, TempoSource, source_from_description
from worker._keys import backfill_runs_key, backfill_state_key, backfill_traces_key
from worker.backfill._driver import Backfill
from worker.backfill._state import BackfillOptions, BackfillState, RedisJobStore, run_id
from worker.cli import cli

SCORERS = "tests.backfill.scorers"
NO_BROKER = {"TRACESCORE_BROKER_URL": ""}
DB = 10  # of the session's Redis: the other backfill tests use 12, 13 and 15


def _state(path: Path, job_id: str = "bf-dup", **options: Any) -> BackfillState:
    return BackfillState(
        job_id=job_id,
        source=FileSource([path]).describe(),
        options=BackfillOptions(scorers_module=SCORERS, scorer_ids=["answer-words"], **options),
    )


def _lines(first: int, last: int) -> list[str]:
    """Traces ``first`` .. ``last - 1``, five to a line (children first, as an exporter writes)."""
    lines = []
    for i in range(first, last, 5):
        spans = []
        for j in range(i, min(i + 5, last)):
            children, root = trace_spans(j)
            spans += [*children, root]
        lines.append(_line(spans))
    return lines


def _written_twice(path: Path) -> Path:
    """200 traces; the first line again at the end, 600 spans later (a collector's retry)."""
    lines = _lines(0, 200)
    path.write_text("".join([*lines, lines[0]]))
    return path


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RedisJobStore]:
    yield from redis_job_store(redis_server, DB)


def test_a_file_named_twice_is_read_once(tmp_path: Path) -> None:
    """``backfill dir dir/part-001.jsonl.gz`` (or a link to a file) read that file twice."""
    write_otlp_files(tmp_path / "in", 100, files=2)
    (tmp_path / "link.jsonl.gz").symlink_to(tmp_path / "in" / "part-000.jsonl.gz")
    source = FileSource([tmp_path / "in", tmp_path / "in" / "part-001.jsonl.gz", tmp_path / "link.jsonl.gz"])
    assert [p.name for p in source.files] == ["part-000.jsonl.gz", "part-001.jsonl.gz"]
    assert len(source.describe()["files"]) == 2


def test_a_directory_linked_into_the_source_is_read_and_a_link_loop_ends(tmp_path: Path) -> None:
    """A subdirectory that is a symlink (another disk's exports linked in) was passed over
    without a word (the source's label said 1 file); it is read, each real directory once."""
    write_otlp_files(tmp_path / "in", 100, files=1)
    write_otlp_files(tmp_path / "elsewhere", 100, files=1)
    (tmp_path / "in" / "more").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere" / "back").symlink_to(tmp_path / "in")  # a loop
    source = FileSource([tmp_path / "in"])
    assert [p.relative_to(tmp_path / "in").as_posix() for p in source.files] == [
        "more/part-000.jsonl.gz",
        "part-000.jsonl.gz",
    ]


def test_a_saved_file_list_is_read_as_saved(tmp_path: Path) -> None:
    """A job of an earlier release saved its list with a file twice; its checkpoint indexes that
    list. Resumed, the list is kept as saved: read with the repeat dropped, the last file was
    never read (and a checkpoint inside the repeat started in another file)."""
    write_otlp_files(tmp_path / "in", 100, files=3)
    a, b, c = sorted((tmp_path / "in").iterdir())
    source = source_from_description({"kind": "files", "files": [str(a), str(b), str(a), str(c)]})
    assert [p.name for p in source.files] == [a.name, b.name, a.name, c.name]
    units = {item.position.unit for item in source.read(Position(3)) if isinstance(item, SpanBatch)}
    assert units == {3}


def test_spans_written_twice_past_the_window_are_sent_once(tmp_path: Path) -> None:
    """The first line again 600 spans later: its five traces were assembled and planned twice
    (the copies counted as runs read again); their 15 spans are late spans of traces read."""
    submitter = CapturingSubmitter()
    state = _state(_written_twice(tmp_path / "t.jsonl"), window_spans=100)
    Backfill(FileSource([tmp_path / "t.jsonl"]), state, submitter).run()
    assert Counter(submitter.runs).most_common(1)[0][1] == 1
    assert len(submitter.runs) == 200
    counters = state.counters
    assert (counters.runs_read, counters.runs_enqueued, counters.runs_read_again) == (200, 200, 0)
    assert (counters.traces_read, counters.late_spans) == (200, 15)


def test_embedded_summary_adds_up_for_spans_written_twice(tmp_path: Path) -> None:
    options = ["--scorers", SCORERS, "--window-spans", "100", "--json", "--sink", "none"]
    result = CliRunner().invoke(
        cli,
        ["backfill", str(_written_twice(tmp_path / "t.jsonl")), *options],
        env=NO_BROKER,
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert (summary["runs_enqueued"], summary["late_spans"]) == (200, 15)
    assert summary["scored"] + summary["failed"] == summary["scores_expected"] == 600
    assert "late spans        15" in result.stderr


def test_a_run_in_a_later_batch_is_checked_against_the_job_store(tmp_path: Path, store: RedisJobStore) -> None:
    """In Redis mode the job's runs are in its store's set; each batch is checked against it
    (five runs an earlier run of the job enqueued, in the 8th batch, are not sent again)."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(_lines(0, 200)))
    state = _state(path, window_spans=100, batch_size=20)
    earlier = [run_id(trace_id(i), f"{i * 3 + 1:016x}") for i in range(150, 155)]
    assert store.save(state, earlier)
    submitter = CapturingSubmitter()
    Backfill(FileSource([path]), state, submitter, job_store=store).run()
    assert len(submitter.runs) == len(set(submitter.runs)) == 195
    assert not {run_id(*run) for run in submitter.runs} & set(earlier)
    assert state.counters.runs_read_again == 5
    assert store.client.scard(backfill_runs_key(state.job_id)) == 200


def _straggler(path: Path) -> tuple[Path, tuple[str, str]]:
    """600 traces; trace 7 has a second LLM call exported 1,200 spans late (a late span)."""
    lines = _lines(0, 600)
    children, _ = trace_spans(7)
    late = dict(children[0], spanId="00000000deadbeef")
    lines.insert(80, _line([late]))
    path.write_text("".join(lines))
    return path, (trace_id(7), "00000000deadbeef")


def _interrupted_then_resumed(
    path: Path, store: RedisJobStore, stop_when: Callable[[BackfillState], bool]
) -> tuple[list[tuple[str, str]], BackfillState]:
    """Run a job until ``stop_when`` (as Ctrl-C would stop it), then resume it from its store."""
    submitter = CapturingSubmitter()
    state = _state(path, window_spans=500, batch_size=20)
    first = Backfill(FileSource([path]), state, submitter, job_store=store, should_stop=lambda: stop_when(state))
    with pytest.raises(KeyboardInterrupt):
        first.run()
    first.interrupted()
    saved = store.load(state.job_id)
    assert saved is not None
    assert saved.checkpoint != (0, 0, 0)
    resumed = Backfill(FileSource([path]), saved, submitter, job_store=store).run()
    return submitter.runs, resumed


def test_a_resume_counts_a_late_span_as_the_job_without_a_stop_does(tmp_path: Path, store: RedisJobStore) -> None:
    """Stopped after trace 7 went out, before its late span was read: the resume reads that span
    as the run without a stop does, a late span of trace 7 (it was a run of its own, a second
    score of trace 7 made of a fragment, until the job kept the traces it read)."""
    path, late_run = _straggler(tmp_path / "t.jsonl")
    uninterrupted = CapturingSubmitter()
    whole = _state(path, job_id="bf-whole", window_spans=500)
    Backfill(FileSource([path]), whole, uninterrupted).run()
    assert late_run not in uninterrupted.runs
    assert whole.counters.late_spans == 1

    runs, state = _interrupted_then_resumed(path, store, lambda s: s.counters.runs_enqueued >= 100)
    assert Counter(runs).most_common(1)[0][1] == 1
    assert sorted(runs) == sorted(uninterrupted.runs)
    assert state.counters.runs_enqueued == len(runs) == 600
    assert (state.counters.late_spans, state.counters.traces_read) == (1, 600)


def test_a_job_of_the_previous_release_enqueues_none_of_its_traces_again(tmp_path: Path, store: RedisJobStore) -> None:
    """The previous release kept enqueued trace ids; resumed by this one, their runs stay sent."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(_lines(0, 50)))
    state = _state(path, batch_size=20)
    store.save(state)
    store.client.sadd(backfill_traces_key(state.job_id), *(trace_id(i) for i in range(10)))
    submitter = CapturingSubmitter()
    Backfill(FileSource([path]), state, submitter, job_store=store).run()
    assert sorted(submitter.runs) == sorted((trace_id(i), f"{i * 3 + 1:016x}") for i in range(10, 50))
    assert state.counters.runs_read_again == 10
    assert store.client.scard(backfill_traces_key(state.job_id)) == 10  # only the new set is written
    store.delete(state.job_id)
    assert not store.client.exists(
        backfill_state_key(state.job_id), backfill_runs_key(state.job_id), backfill_traces_key(state.job_id)
    )


def test_a_jobs_run_ids_are_read_back_once_each_and_none_for_a_previous_release_job(
    tmp_path: Path, store: RedisJobStore
) -> None:
    """A resumed job's sink lines are the whole job's, from its run ids in Redis: every one of
    them, each once, over several scans; a job the previous release started kept its first runs
    as trace ids, their spans unknown: None (its sink lines stay this run's)."""
    path = tmp_path / "t.jsonl"
    path.write_text("")
    state = _state(path)
    runs = [run_id(trace_id(i), f"{i:016x}") for i in range(12_000)]
    store.save(state, runs[:7000])
    store.save(state, runs[7000:])  # (a resume's)
    read = list(store.run_ids(state.job_id, count=1000) or ())
    assert sorted(read) == sorted(runs)
    store.client.sadd(backfill_traces_key(state.job_id), trace_id(0))
    assert store.run_ids(state.job_id) is None
    store.delete(state.job_id)


def test_spans_past_the_per_trace_cap_are_counted_and_reported(tmp_path: Path) -> None:
    """12,000 LLM calls under one root: 2,000 were dropped without a word."""
    children, root = trace_spans(1)
    spans = [dict(children[0], spanId=f"{0x100000 + k:016x}") for k in range(12_000)]
    root = dict(root, name="POST /batch", attributes=[])
    path = tmp_path / "big.jsonl"
    path.write_text("".join([_line(spans[i : i + 500]) for i in range(0, len(spans), 500)] + [_line([root])]))
    result = CliRunner().invoke(
        cli, ["backfill", str(path), "--scorers", SCORERS, "--dry-run", "--json"], env=NO_BROKER
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["spans_dropped"] == 2000
    assert summary["runs_to_score"] == 10_000
    assert result.stderr.count(f"trace {trace_id(1)}: 2,000 spans past the first 10,000 dropped") == 1


def _tempo_trace(i: int) -> list[Any]:
    children, root = trace_spans(i, step_ns=10 * 10**9)
    return decode_otlp_json({"resourceSpans": [{"scopeSpans": [{"spans": [*children, root]}]}]})


def _answer(content_type: str, body: bytes) -> Callable[[Any], None]:
    def answer(handler: Any) -> None:
        FakeTempo._send(handler, 200, body, content_type)

    return answer


def test_a_tempo_trace_answered_empty_or_with_other_traces_is_malformed() -> None:
    """An empty 200 (protobuf, ``{}``, no batches) made the trace vanish uncounted."""
    fake = FakeTempo().start()
    try:
        for i in range(6):
            fake.add(_tempo_trace(i))
        fake.raw_answers[trace_id(1)] = _answer("application/protobuf", b"")
        fake.raw_answers[trace_id(2)] = _answer("application/json", b"{}")
        fake.raw_answers[trace_id(3)] = _answer("application/json", b'{"batches":[]}')
        # Trace 4 answered with trace 5's spans.
        fake.raw_answers[trace_id(4)] = _answer(
            "application/protobuf", encode_spans(_tempo_trace(5)).SerializeToString()
        )
        source = TempoSource(fake.url, since_ns=BASE_NS, until_ns=BASE_NS + 60 * 10**9)
        items = list(source.read())
    finally:
        fake.stop()
    read = sorted({s.trace_id for i in items if isinstance(i, SpanBatch) for s in i.spans})
    assert read == sorted([trace_id(0), trace_id(5)])
    said = sorted((i.where, i.reason) for i in items if isinstance(i, Malformed))
    assert said == sorted(
        [(f"tempo trace {trace_id(n)}", f"Tempo answered no spans for trace {trace_id(n)}") for n in (1, 2, 3, 4)]
        + [(f"tempo trace {trace_id(4)}", "Tempo answered 3 span(s) of other traces: skipped")]
    )


def test_tempo_failing_mid_job_leaves_it_resumable_and_says_how(redis_server: RedisServer) -> None:
    """Tempo's search answering 503 after the first window printed "error: SourceError: ..." and
    left the job "reading", with no word of resuming; resumed, it goes on where it stopped."""
    step = 60 * 10**9  # a trace a minute: three windows of an hour
    fake = FakeTempo().start()
    client = redis_server.client(DB, decode_responses=True)
    client.flushdb()
    try:
        for i in range(180):
            children, root = trace_spans(i, step_ns=step)
            fake.add(decode_otlp_json({"resourceSpans": [{"scopeSpans": [{"spans": [*children, root]}]}]}))
        healthy = fake._handle
        searches = [0]

        def failing(handler: Any) -> None:
            if handler.path.startswith("/api/search"):
                searches[0] += 1
                if searches[0] > 1:
                    FakeTempo._send(handler, 503, b"ingester unavailable", "text/plain")
                    return
            healthy(handler)

        fake._handle = failing  # type: ignore[method-assign]
        since, until = str(BASE_NS // 10**9), str(BASE_NS // 10**9 + 3 * 3600)
        broker = ["--broker", redis_server.url(DB)]
        options = ["--scorers", SCORERS, "--batch-size", "20", "--window-spans", "30", *broker]
        result: Result = CliRunner().invoke(
            cli,
            ["backfill", "tempo+" + fake.url, "--since", since, "--until", until, *options],
            env={**NO_BROKER, "TRACESCORE_TEMPO_HEADERS": ""},
        )
        assert result.exit_code == 1, result.output
        (key,) = list(client.scan_iter(backfill_state_key("*")))
        job_id = key.rsplit(":", 1)[1]
        assert f"resume with: tracescore backfill --resume {job_id}" in result.stderr, result.stderr
        assert "Traceback" not in result.output
        assert redis_server.password not in result.output
        state = json.loads(client.get(key) or "{}")
        assert state["status"] == "interrupted"
        assert 0 < state["counters"]["runs_enqueued"] < 180

        fake._handle = healthy  # type: ignore[method-assign]
        resumed = CliRunner().invoke(
            cli, ["backfill", "--resume", job_id, "--no-wait", "--json", *broker], env=NO_BROKER
        )
        assert resumed.exit_code == 0, resumed.output
        summary = json.loads(resumed.stdout.strip().splitlines()[-1])
        assert (summary["status"], summary["runs_enqueued"]) == ("enqueued", 180)
        assert client.scard(backfill_runs_key(job_id)) == 180
    finally:
        fake.stop()
        client.flushdb()
        client.close()


def test_a_trace_some_of_whose_runs_went_sends_only_the_others(tmp_path: Path, store: RedisJobStore) -> None:
    """One request of three runs, one of them enqueued before (a resume): the other two go, in a
    request with the same spans, as the JSON the byte cutter hands over."""
    line, ids = _three_agent_line()
    path = tmp_path / "t.jsonl"
    path.write_text(line)
    state = _state(path)
    (trace,) = {s.trace_id for item in FileSource([path]).read() if isinstance(item, SpanBatch) for s in item.spans}
    store.save(state, [run_id(trace, ids["researcher"])])
    submitter = CapturingSubmitter(8 * 2**20)
    Backfill(FileSource([path]), state, submitter, job_store=store).run()
    ((batch, encoded),) = submitter.sent
    (request,) = batch.requests
    assert request.target_span_ids == [ids["planner"], ids["writer"]]
    assert len(request.spans) == 8
    assert encoded == [request_json(request)]
    assert (state.counters.runs_enqueued, state.counters.runs_read_again) == (2, 1)
