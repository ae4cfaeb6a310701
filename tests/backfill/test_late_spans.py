"""Spans of a trace already read that arrive past the assembly window: counted and named, never a
fragment scored as a trace of its own.

A trace is read once its window has passed (with its root, or idle without one). A span of it
that comes later (later in the file, or in a later file) found no trace open and started one: the
fragment was read as a trace, its outermost LLM span a run of its own, a second score for the
trace (or, resumed, the job's run read again and counted as a second trace).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests._redis import RedisServer
from tests.backfill._doubles import CapturingSubmitter, Messages, redis_job_store
from tests.backfill._late import (
    SECOND_CALL_OF_0,
    Resumed,
    late_files,
    late_llm_call,
    late_llm_call_files,
    line,
    stop_and_resume,
    stop_and_resume_in_process,
    whole,
)
from tests.backfill._synth import trace_id, trace_spans
from tracing.otlp import decode_otlp_records
from tracing.sources import FileSource, Position, Released, TraceAssembler
from worker._keys import backfill_rootless_key, backfill_runs_key
from worker.backfill._driver import Backfill
from worker.backfill._state import BackfillOptions, BackfillState, late_by_option
from worker.cli import cli

DB = 8  # of the session's Redis: the other backfill tests use 10 to 15


CHAT_OF_0 = f"{2:016x}"  # trace 0's chat span (an LLM span under its agent root)


def _late_chat_files(directory: Path) -> Path:
    """Trace 0's tool span and root in file a, its chat span 20 lines into file c (past a 50-span
    window and two file boundaries: trace 0 is read, with its root, long before); 91 traces."""
    (chat, tool), root = trace_spans(0)
    return late_files(directory, [tool, root], [chat])


def _backfill_in_process(directory: Path, job_id: str) -> tuple[BackfillState, CapturingSubmitter, Messages]:
    """The driver over ``directory`` (an answer-words job, a 50-span window), scoring captured:
    its state at the end, what it submitted and what it said."""
    source = FileSource([directory])
    options = BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"], window_spans=50)
    state = BackfillState(job_id=job_id, source=source.describe(), options=options)
    reporter = Messages()
    submitter = CapturingSubmitter()
    return Backfill(source, state, submitter, reporter=reporter).run(), submitter, reporter


def test_a_span_after_its_traces_window_is_a_counted_late_span_not_a_run(tmp_path: Path) -> None:
    """The command line, embedded: trace 0's chat span, read after trace 0 was scored, was read as
    a trace of its own (92 traces) and its LLM span scored as a run no trace has (92 scores). Now:
    91 traces, 91 scores, one late span named in the summary with the option to raise."""
    directory = _late_chat_files(tmp_path / "in")
    out = tmp_path / "scores.jsonl"
    args = ["backfill", str(directory), "--scorers", "tests.backfill.scorers", "--scorer", "answer-words"]
    result = CliRunner().invoke(
        cli, [*args, "--window-spans", "50", "--out", str(out), "--json"], env={"TRACESCORE_BROKER_URL": ""}
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["traces_read"] == 91
    assert summary["late_spans"] == 1
    targets = [(r["trace_id"], r["span_id"]) for r in map(json.loads, out.read_text().splitlines())]
    assert len(targets) == 91
    assert (trace_id(0), CHAT_OF_0) not in targets  # the fragment is no run
    assert trace_id(0) in result.stderr  # named, with the option that would have kept it
    assert "--window-spans" in result.stderr

    assert summary["late_spans_by_option"] == {"--window-spans": 1}
    assert "--max-open-spans" not in result.stderr  # the memory bound released nothing

    text = CliRunner().invoke(cli, [*args, "--window-spans", "50"], env={"TRACESCORE_BROKER_URL": ""})
    assert text.exit_code == 0, text.output
    (line,) = [line for line in text.output.splitlines() if "late spans" in line]
    assert line.split()[:3] == ["late", "spans", "1"]
    assert "--window-spans" in line
    assert "--max-open-spans" not in line


def _late_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "late spans" in line or "arrived after" in line]


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_late_span_of_a_trace_the_memory_bound_released_names_max_open_spans(tmp_path: Path, dry_run: bool) -> None:
    """The same input read with the default window but at most 30 spans held: trace 0 is released
    early by the memory bound long before its chat span comes, so a wider window would not have
    kept it; the late span was said to want a wider --window-spans all the same. Now the summary
    (text and --json, scored or --dry-run) and the trace's message name --max-open-spans."""
    directory = _late_chat_files(tmp_path / "in")
    args = ["backfill", str(directory), "--scorers", "tests.backfill.scorers", "--scorer", "answer-words"]
    args += ["--max-open-spans", "30", *(["--dry-run"] if dry_run else [])]
    env = {"TRACESCORE_BROKER_URL": ""}
    result = CliRunner().invoke(cli, [*args, "--json"], env=env)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["evicted_traces"] > 0
    assert (summary["late_spans"], summary["late_spans_by_option"]) == (1, {"--max-open-spans": 1})
    (message,) = [line for line in _late_lines(result.stderr) if trace_id(0) in line]
    assert "--max-open-spans" in message
    assert "--window-spans" not in message

    text = CliRunner().invoke(cli, args, env=env)
    assert text.exit_code == 0, text.output
    (line,) = [line for line in _late_lines(text.output) if trace_id(0) not in line]
    assert "--max-open-spans" in line
    assert "--window-spans" not in line


def test_a_late_span_of_a_trace_read_without_its_root_is_no_second_trace(tmp_path: Path) -> None:
    """Trace 0's chat span, then its tool span past the window with no root in between: the chat
    span was read as trace 0 (rootless, idle), then the tool span as a second trace 0. The second
    LLM call beside it hangs under the root no part read: that root may be an agent (exporters
    send it last), whose run holds both calls, so the call is a late span, not a run of its own."""
    (chat, tool), _root = trace_spans(0)
    late = {**chat, "spanId": f"{0xAB:016x}", "name": "chat gpt-4o-mini (retry)"}  # a second LLM call
    (tmp_path / "a.jsonl").write_text(line([chat]) + "".join(whole(i) for i in range(1, 31)))
    (tmp_path / "b.jsonl").write_text("".join(whole(i) for i in range(31, 61)))
    (tmp_path / "c.jsonl").write_text(line([late, tool]) + "".join(whole(i) for i in range(61, 71)))
    done, submitter, reporter = _backfill_in_process(tmp_path, "bf-late-span")
    assert done.counters.traces_read == 71
    assert (done.counters.late_spans, done.counters.late_runs) == (2, 0)
    assert done.counters.late_roots == 0
    assert [run for run in submitter.runs if run[0] == trace_id(0)] == [(trace_id(0), CHAT_OF_0)]
    assert any(trace_id(0) in line and "--window-spans" in line for line in reporter.lines)


def _no_agent(span: dict[str, Any], span_id: int, parent: int | None, name: str) -> dict[str, Any]:
    """Trace 0's ``span`` as span ``span_id`` under ``parent``, named ``name`` (a root that is no
    agent: ``POST /ask`` and no attributes)."""
    made = {**span, "spanId": f"{span_id:016x}", "name": name}
    if parent is None:
        made.pop("parentSpanId", None)
        made["attributes"] = []
    else:
        made["parentSpanId"] = f"{parent:016x}"
    return made


def test_a_late_call_under_a_span_a_run_read_before_holds_is_no_run(tmp_path: Path) -> None:
    """Trace 0 in three parts, each past the window: a root that is no agent (R), its LLM call
    (L1) and a tool span (X) under a span not read (Q); then Q and a tool span, both under L1;
    then an LLM call (M) under X. A whole read makes L1 the one run (M is inside it): M was
    scored as a run of its own, X's id kept open though Q put it under L1's run."""
    (chat, tool), root = trace_spans(0)
    first = [_no_agent(root, 0xA0, None, "POST /ask"), _no_agent(chat, 0xA1, 0xA0, chat["name"])]
    first.append(_no_agent(tool, 0xA3, 0xA2, tool["name"]))
    second = [_no_agent(tool, 0xA2, 0xA1, tool["name"]), _no_agent(tool, 0xA4, 0xA1, tool["name"])]
    third = [_no_agent(chat, 0xA5, 0xA3, chat["name"])]
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "a.jsonl").write_text(line(first) + "".join(whole(i) for i in range(1, 31)))
    (tmp_path / "b.jsonl").write_text(line(second) + "".join(whole(i) for i in range(31, 61)))
    (tmp_path / "c.jsonl").write_text("".join(whole(i) for i in range(61, 91)))
    (tmp_path / "d.jsonl").write_text("".join(whole(i) for i in range(91, 111)) + line(third))
    done, submitter, _reporter = _backfill_in_process(tmp_path, "bf-late-inside")
    assert [run for run in submitter.runs if run[0] == trace_id(0)] == [(trace_id(0), f"{0xA1:016x}")]
    assert (done.counters.late_runs, done.counters.late_spans) == (0, 3)


def test_a_late_call_of_a_trace_read_with_no_run_is_scored(tmp_path: Path) -> None:
    """Trace 0 read with its root (no agent) and a tool span, no LLM call: nothing to score, and
    its one LLM call, past the window, was a late span (the plan of the part read was dropped
    with the trace): no run of the trace scored, though a whole read scores the call. Now the
    call is scored as a late run, and the trace no longer counted as having nothing to score."""
    (chat, tool), root = trace_spans(0)
    root = {**root, "name": "POST /ask", "attributes": []}
    done, submitter, _ = _backfill_in_process(late_files(tmp_path / "in", [tool, root], [chat]), "bf-no-run")
    assert [run for run in submitter.runs if run[0] == trace_id(0)] == [(trace_id(0), CHAT_OF_0)]
    counters = done.counters
    assert (counters.traces_read, counters.runs_enqueued) == (91, 91)
    assert (counters.late_runs, counters.late_spans) == (1, 0)
    assert "no_target" not in counters.unreadable


@pytest.mark.parametrize("stop_after", [2, 5, 9])
def test_a_late_first_run_past_a_resumes_checkpoint_takes_no_target_back_once(
    tmp_path: Path, redis_server: RedisServer, stop_after: int
) -> None:
    """The trace read with no run (counted no_target, the count saved), its only LLM call past
    the checkpoint: the resume scores the call and takes the saved count back, as the job without
    a stop does (not twice, nor left counted)."""
    (chat, tool), root = trace_spans(0)
    root = {**root, "name": "POST /ask", "attributes": []}
    directory = late_files(tmp_path / "in", [tool, root], [chat])
    job = stop_and_resume_in_process(
        directory, redis_server, DB, "bf-no-run", lambda sent: len(sent.sent) >= stop_after
    )
    assert (0, 1, 0) < job.checkpoint < (2, 21, 0)  # past trace 0's read, before its call
    counters, whole = job.resumed.counters, job.whole.counters
    assert "no_target" not in whole.unreadable
    assert (counters.traces_read, counters.runs_enqueued, counters.late_runs, counters.late_spans) == (91, 91, 1, 0)
    assert counters.unreadable == whole.unreadable
    assert job.submitter.runs.count((trace_id(0), CHAT_OF_0)) == 1


def test_a_late_run_read_twice_is_counted_and_said_once(tmp_path: Path) -> None:
    """The same input in two files (a collector that wrote it twice): trace 0's late LLM call
    came twice, and its first call again, each planned as a late run: counted as late runs (3)
    and each said "scored as a run of its own", though the job sent the two runs once. Now the
    runs read again are counted so, not as late runs."""
    (chat, _tool), root = trace_spans(0)
    root = {**root, "name": "POST /ask", "attributes": []}
    second = {**chat, "spanId": SECOND_CALL_OF_0, "name": "chat gpt-4o-mini (follow-up)"}
    text = line([chat, root]) + "".join(whole(i) for i in range(1, 31)) + line([second])
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "a.jsonl").write_text(text)
    (tmp_path / "b.jsonl").write_text(text)
    done, submitter, reporter = _backfill_in_process(tmp_path, "bf-late-twice")
    assert [run for run in submitter.runs if run[0] == trace_id(0)] == [
        (trace_id(0), CHAT_OF_0),
        (trace_id(0), SECOND_CALL_OF_0),
    ]
    assert done.counters.late_runs == 1
    assert done.counters.runs_read_again >= 2
    assert len([said for said in reporter.lines if "scored as a run of its own" in said]) == 1


def test_the_record_of_read_traces_is_bounded() -> None:
    """The assembler remembers the newest ``released_kept`` traces it released, not all: a span
    of a trace released further back starts a trace (it cannot be told from a new one)."""
    assembler = TraceAssembler(window_spans=1, max_open_spans=10)
    assert assembler.released_kept == 10_000
    for i in range(10_001):
        children, root = trace_spans(i)
        spans = decode_otlp_records({"resourceSpans": [{"scopeSpans": [{"spans": [*children, root]}]}]})
        list(assembler.add(spans, Position(0, i + 1)))
    assert len(list(assembler.finish())) == 1  # 10,001 released: trace 0, the oldest, forgotten
    (chat_0, _), _ = trace_spans(0)
    (chat_1, _), _ = trace_spans(1)
    for n, chat in enumerate((chat_0, chat_1)):
        spans = decode_otlp_records({"resourceSpans": [{"scopeSpans": [{"spans": [chat]}]}]})
        list(assembler.add(spans, Position(0, 20_000 + n)))
    released = list(assembler.finish())
    by_id = {t.trace_id: t for t in released}
    assert not by_id[trace_id(0)].late  # forgotten: read as a trace
    assert by_id[trace_id(1)].late  # the 10,000th newest: still known


@pytest.mark.parametrize("stop_after", [2, 5, 9])
def test_a_late_span_past_a_resumes_checkpoint_is_still_a_late_span(
    tmp_path: Path, redis_server: RedisServer, stop_after: int
) -> None:
    """Stopped after trace 0 was sent (its chat span not yet read), then resumed: the resumed run's
    assembler never saw trace 0, so the chat span was a trace of its own there (a second run of
    trace 0 enqueued, 92 traces). Now the job counts and sends what it does without a stop."""
    job = stop_and_resume_in_process(
        _late_chat_files(tmp_path / "in"), redis_server, DB, "bf-late-span", lambda sent: len(sent.sent) >= stop_after
    )
    assert job.whole.counters.traces_read == 91
    assert (trace_id(0), f"{1:016x}") in job.runs_at_stop  # trace 0 went out before the stop
    assert job.checkpoint < (2, 21, 0)  # before the chat span's line: the resume reads it

    assert job.resumed.counters.traces_read == 91
    assert job.resumed.counters.late_spans == job.whole.counters.late_spans == 1
    assert sorted(set(job.submitter.runs)) == sorted(job.uninterrupted.runs)
    assert (trace_id(0), CHAT_OF_0) not in job.submitter.runs
    assert job.resumed.counters.runs_enqueued == job.whole.counters.runs_enqueued


def test_a_late_span_after_ctrl_c_and_resume_is_counted_once_and_never_enqueued(
    tmp_path: Path, private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line, a Ctrl-C (SIGINT) once trace 0 went out, then ``--resume``: the resume
    read trace 0's chat span as a trace of its own and enqueued it (92 traces, 92 runs: trace 0
    scored twice, once as its agent run, once as a fragment). Now the job's summary counts 91
    traces and the span once, and the chat span is no run of the job."""
    directory = _late_chat_files(tmp_path / "in")
    job = stop_and_resume(directory, private_redis, monkeypatch, ["--window-spans", "50"])
    assert (0, 1, 0) < tuple(job.saved["checkpoint"]) < (2, 21, 0)  # past trace 0, before its chat span
    assert f"{trace_id(0)}:{1:016x}" in job.runs_at_stop  # trace 0 sent, whole but one

    done = job.done
    assert (done["traces_read"], done["runs_enqueued"]) == (91, 91)
    assert done["late_spans"] == 1
    db = private_redis.client(0, decode_responses=True)
    assert db.scard(backfill_runs_key(job.job_id)) == 91
    assert not db.sismember(backfill_runs_key(job.job_id), f"{trace_id(0)}:{CHAT_OF_0}")
    assert trace_id(0) in job.resumed.stderr
    assert done["late_spans_by_option"] == {"--window-spans": 1}


def test_a_resume_keeps_why_a_trace_was_released_before_its_late_span(
    tmp_path: Path, private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped by Ctrl-C after the memory bound released trace 0 (and saved it among the traces
    read), resumed before its chat span: the resume's late span names --max-open-spans, as the
    job without a stop does, not the window (the job's list of released traces keeps the cause)."""
    directory = _late_chat_files(tmp_path / "in")
    job = stop_and_resume(directory, private_redis, monkeypatch, ["--max-open-spans", "30"])
    assert (0, 1, 0) < tuple(job.saved["checkpoint"]) < (2, 21, 0)  # past trace 0, before its chat span
    assert f"{trace_id(0)}:{1:016x}" in job.runs_at_stop  # trace 0 sent before the stop

    done = job.done
    assert (done["traces_read"], done["runs_enqueued"]) == (91, 91)
    assert (done["late_spans"], done["late_spans_by_option"]) == (1, {"--max-open-spans": 1})
    (message,) = [line for line in _late_lines(job.resumed.stderr) if trace_id(0) in line]
    assert "--max-open-spans" in message
    assert "--window-spans" not in message


def test_a_late_llm_call_that_is_a_run_of_its_own_is_scored_not_lost(tmp_path: Path) -> None:
    """A late top-level LLM call of a trace without an agent was counted as a late span and never
    scored: a run lost, though no run of the trace held it. Now it is scored as the run a whole
    read makes (the trace counted once), and counted as a late run, not a late span."""
    done, submitter, reporter = _backfill_in_process(late_llm_call_files(tmp_path / "in"), "bf-late-run")
    assert [run for run in submitter.runs if run[0] == trace_id(0)] == [
        (trace_id(0), CHAT_OF_0),
        (trace_id(0), SECOND_CALL_OF_0),
    ]
    counters = done.counters
    assert (counters.traces_read, counters.runs_enqueued) == (91, 92)
    assert (counters.late_spans, counters.late_runs) == (0, 1)
    (said,) = [line for line in reporter.lines if trace_id(0) in line]
    assert "scored as a run of its own" in said


@pytest.mark.parametrize("stop_after", [2, 5, 9])
def test_a_late_run_past_a_resumes_checkpoint_is_scored_once(
    tmp_path: Path, redis_server: RedisServer, stop_after: int
) -> None:
    """Stopped after trace 0 went out (its late LLM call not yet read), then resumed: the resume
    knows from the job's list of traces read that the call hangs under a span no run of trace 0
    held, and scores it, as the job without a stop does: each run once, the counts the same."""
    job = stop_and_resume_in_process(
        late_llm_call_files(tmp_path / "in"), redis_server, DB, "bf-late-run", lambda sent: len(sent.sent) >= stop_after
    )
    assert (trace_id(0), CHAT_OF_0) in job.runs_at_stop
    assert (trace_id(0), SECOND_CALL_OF_0) not in job.runs_at_stop
    assert (0, 1, 0) < job.checkpoint < (2, 21, 0)  # past trace 0, before its late call: the resume reads it
    assert (job.whole.counters.late_runs, job.whole.counters.late_spans) == (1, 0)
    assert sorted(set(job.submitter.runs)) == sorted(job.uninterrupted.runs)
    assert job.submitter.runs.count((trace_id(0), SECOND_CALL_OF_0)) == 1
    counters, whole = job.resumed.counters, job.whole.counters
    assert (counters.traces_read, counters.runs_enqueued, counters.late_runs, counters.late_spans) == (
        whole.traces_read,
        whole.runs_enqueued,
        1,
        0,
    )


def _stopped_after_the_late_call(tmp_path: Path, redis_server: RedisServer, job_id: str, batches_after: int) -> Resumed:
    """The held-open late-call files' job stopped ``batches_after`` batches after the batch that
    sent trace 0's late call, then resumed (``stop_and_resume_in_process``)."""
    late_call = (trace_id(0), SECOND_CALL_OF_0)

    def sent_late(submitter: CapturingSubmitter) -> bool:
        sent = [
            n
            for n, (batch, _) in enumerate(submitter.sent)
            if any((r.trace_id, s) == late_call for r in batch.requests for s in r.target_span_ids)
        ]
        return bool(sent) and len(submitter.sent) > sent[0] + batches_after

    directory = late_llm_call_files(tmp_path / "in", held_open=True)
    return stop_and_resume_in_process(directory, redis_server, DB, job_id, sent_late)


@pytest.mark.parametrize("batches_after", [0, 2])
def test_a_late_run_sent_before_a_stop_and_read_again_by_the_resume_is_counted_once(
    tmp_path: Path, redis_server: RedisServer, batches_after: int
) -> None:
    """Trace 0's late call sent, then the job stopped ``batches_after`` batches on, its checkpoint
    before the call (trace 200, open, holds it back): the stop saved the call among the job's runs
    but not as a late run (its count, taken from input past the checkpoint, left for the resume),
    and the resume's read of it counted it as a late run and as a run read again. Now the job
    counts a late run where it sends it, with the runs it enqueues (saved so at the stop), and the
    resume's read of it as read again alone; and it counts trace 0 once in ``traces_enqueued``,
    with or without a stop (its late call's batch counted it again)."""
    late_call = (trace_id(0), SECOND_CALL_OF_0)
    job = _stopped_after_the_late_call(tmp_path, redis_server, "bf-late-sent", batches_after)
    assert late_call in job.runs_at_stop
    assert (0, 1, 0) < job.checkpoint < (2, 25, 0)  # before the late call's line: the resume reads it again
    whole, saved, resumed = job.whole.counters, job.saved.counters, job.resumed.counters
    assert (whole.late_runs, whole.runs_read_again) == (1, 0)
    assert saved.late_runs == 1  # sent before the stop
    assert resumed.late_runs == 1  # the resume's read of it: read again alone
    assert resumed.runs_read_again > saved.runs_read_again
    assert job.submitter.runs.count(late_call) == 1
    traces = len({t for t, _ in job.uninterrupted.runs})
    assert (whole.traces_enqueued, saved.traces_enqueued) == (traces, len({t for t, _ in job.runs_at_stop}))
    assert (resumed.runs_enqueued, resumed.traces_enqueued) == (whole.runs_enqueued, traces)


@pytest.mark.parametrize("batches_after", [0, 2])
def test_a_resume_reading_again_a_late_run_sent_says_so(
    tmp_path: Path, redis_server: RedisServer, batches_after: int
) -> None:
    """Trace 0's late call sent, the job stopped with its checkpoint before the call: the resume,
    reading the call again, said it was "scored as a run of its own", though it sent nothing
    (the run was the job's already). It says the run was read again, not sent again."""
    late_call = (trace_id(0), SECOND_CALL_OF_0)
    job = _stopped_after_the_late_call(tmp_path, redis_server, "bf-late-said", batches_after)
    assert (0, 1, 0) < job.checkpoint < (2, 25, 0)  # before the late call's line: the resume reads it again
    assert job.submitter.runs.count(late_call) == 1
    stopped, resumed = ([said for said in lines if trace_id(0) in said] for lines in job.said)
    assert len(stopped) == 1
    assert "scored as a run of its own" in stopped[0]
    (said,) = resumed
    assert "scored as a run of its own" not in said
    assert f"a run of its own (span {SECOND_CALL_OF_0}) this job enqueued before: read again, not sent again" in said


@pytest.mark.parametrize("stop_after", [2, 5, 9])
def test_a_trace_whose_runs_were_rejected_counts_in_traces_enqueued_with_its_late_run_across_a_resume(
    tmp_path: Path, redis_server: RedisServer, stop_after: int
) -> None:
    """Trace 0's first call over the message cap (rejected), its late call not: the job without a
    stop counted trace 0 in ``traces_enqueued`` when the late call went, but the note allowing it
    was in memory, so a resume past trace 0's read did not (90 of 91). A trace counts once any run
    of it is enqueued, once over the job: the note is kept with the job's list of traces read."""
    early, late = late_llm_call(0, SECOND_CALL_OF_0)
    chat, root = early
    answer = json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "x" * 10_000}]}])
    output = {"key": "gen_ai.output.messages", "value": {"stringValue": answer}}
    directory = late_files(tmp_path / "in", [{**chat, "attributes": [*chat["attributes"], output]}, root], late)
    job = stop_and_resume_in_process(
        directory, redis_server, DB, "bf-rejected-late", lambda sent: len(sent.sent) >= stop_after, room=8000
    )
    assert (0, 1, 0) < job.checkpoint < (2, 21, 0)  # past trace 0's read, before its late call
    whole, saved, resumed = job.whole.counters, job.saved.counters, job.resumed.counters
    assert (whole.runs_rejected, whole.late_runs, whole.runs_enqueued) == ({"too_large": 1}, 1, 91)
    assert whole.traces_enqueued == 91  # trace 0 with its late call, and traces 1 to 90
    assert saved.runs_rejected == {"too_large": 1}
    assert trace_id(0) not in {t for t, _ in job.runs_at_stop}
    assert job.submitter.runs.count((trace_id(0), SECOND_CALL_OF_0)) == 1
    assert (resumed.runs_enqueued, resumed.late_runs) == (91, 1)
    assert resumed.traces_enqueued == 91


def test_a_late_run_after_ctrl_c_and_resume_is_enqueued_once_and_counted(
    tmp_path: Path, private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line, a Ctrl-C once trace 0 went out, then ``--resume``: the late LLM call is
    one run of the job (its run id in the job's set once), the summary counts it as a late run."""
    job = stop_and_resume(late_llm_call_files(tmp_path / "in"), private_redis, monkeypatch, ["--window-spans", "50"])
    assert (0, 1, 0) < tuple(job.saved["checkpoint"]) < (2, 21, 0)  # past trace 0, before its late call
    assert f"{trace_id(0)}:{CHAT_OF_0}" in job.runs_at_stop
    done = job.done
    assert (done["traces_read"], done["runs_enqueued"], done["traces_enqueued"]) == (91, 92, 91)
    assert (done["late_runs"], done["late_spans"]) == (1, 0)
    db = private_redis.client(0, decode_responses=True)
    assert db.scard(backfill_runs_key(job.job_id)) == 92
    assert db.sismember(backfill_runs_key(job.job_id), f"{trace_id(0)}:{SECOND_CALL_OF_0}")


def test_a_late_llm_call_under_a_run_read_is_a_late_span(tmp_path: Path) -> None:
    """The same late call, but under trace 0's first LLM call (a call it made): that run was read
    and scored without it, so the call is a late span, not a run."""
    (chat, _tool), root = trace_spans(0)
    root = {**root, "name": "POST /ask", "attributes": []}
    nested = {**chat, "spanId": SECOND_CALL_OF_0, "parentSpanId": CHAT_OF_0}
    directory = late_files(tmp_path / "in", [chat, root], [nested])
    source = FileSource([directory])
    options = BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"], window_spans=50)
    submitter = CapturingSubmitter()
    state = BackfillState(job_id="bf-late-nested", source=source.describe(), options=options)
    done = Backfill(source, state, submitter, reporter=Messages()).run()
    assert [run for run in submitter.runs if run[0] == trace_id(0)] == [(trace_id(0), CHAT_OF_0)]
    assert (done.counters.late_spans, done.counters.late_runs) == (1, 0)


def test_a_late_span_of_a_trace_an_earlier_release_kept_names_no_cause_it_does_not_know(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """A job whose list of traces read an earlier release wrote (no cause kept: trace 0 read with
    its root) counted trace 0's late span as past the window, which it may not have been. Now its
    cause is unknown, in the counts by option and in the line, which names both options."""
    directory = tmp_path / "in"
    directory.mkdir()
    (chat, _tool), _root = trace_spans(0)
    (directory / "c.jsonl").write_text(line([chat]) + "".join(whole(i) for i in range(1, 11)))
    with contextlib.closing(redis_job_store(redis_server, DB)) as stores:
        store = next(stores)
        store.client.rpush(backfill_rootless_key("bf-old-list"), f"r:{trace_id(0)}")
        assert store.released("bf-old-list") == ([Released(trace_id(0), True, None, None)], set())
        source = FileSource([directory])
        options = BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"])
        state = BackfillState(job_id="bf-old-list", source=source.describe(), options=options)
        reporter = Messages()
        done = Backfill(source, state, CapturingSubmitter(), job_store=store, reporter=reporter).run()
    counters = done.counters
    assert (counters.late_spans, counters.late_spans_window, counters.late_spans_evicted) == (1, 0, 0)
    assert late_by_option(counters.late_spans, counters.late_spans_window, counters.late_spans_evicted) == {
        "unknown": 1
    }
    (said,) = [said for said in reporter.lines if trace_id(0) in said]
    assert "--window-spans, now 10,000, or --max-open-spans, now 100,000" in said
