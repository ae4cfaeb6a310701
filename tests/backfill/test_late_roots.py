"""Roots that arrive late: counted and reported, never a silent second (rootless) trace.

Exporters write children before their root (the root ends last). A trace whose root comes
after the assembly window has been released without it; when the root then arrives it is a
*late root*. A trace with more spans than the per-trace cap keeps its root all the same.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests._redis import RedisServer
from tests.backfill._doubles import CapturingSubmitter, Messages
from tests.backfill._late import late_files, line, stop_and_resume, stop_and_resume_in_process, whole
from tests.backfill._synth import trace_id, trace_spans
from tracing.otlp import decode_otlp_records
from tracing.sources import FileSource, Position, TraceAssembler
from worker._keys import backfill_runs_key
from worker.backfill._driver import Backfill
from worker.backfill._state import BackfillOptions, BackfillState
from worker.cli import cli

DB = 14  # of the session's Redis: the other backfill tests use 10, 11, 12, 13 and 15


def test_a_root_after_the_window_is_a_counted_late_root(tmp_path: Path) -> None:
    """Trace 0's children in file a, its root two files later (after 50+ spans and a file
    boundary): the trace is read once, without its root, and the root is one late root with
    a message naming the trace and the window option; not a second, unreadable trace."""
    late_children, late_root = trace_spans(0)
    (tmp_path / "a.jsonl").write_text(line(late_children) + "".join(whole(i) for i in range(1, 31)))
    (tmp_path / "b.jsonl").write_text("".join(whole(i) for i in range(31, 61)))
    (tmp_path / "c.jsonl").write_text(line([late_root]) + "".join(whole(i) for i in range(61, 71)))
    source = FileSource([tmp_path])
    options = BackfillOptions(
        scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"], window_spans=50, window_files=1
    )
    state = BackfillState(job_id="bf-late", source=source.describe(), options=options)
    reporter = Messages()
    done = Backfill(source, state, None, reporter=reporter).run()

    counters = done.counters
    assert counters.late_roots == 1
    assert counters.unreadable == {}  # the old driver read the root alone: "no_content"
    assert counters.traces_read == 71
    assert counters.runs_read == 71
    (message,) = [line for line in reporter.lines if "root span arrived after" in line]
    assert trace_id(0) in message
    assert "--window-spans" in message


def test_a_root_after_the_byte_bound_released_its_trace_names_max_open_mb(tmp_path: Path) -> None:
    """Trace 0's children hold a 1.5 MB prompt, over a 1 MiB --max-open-mb on their own: they
    are released at once, and the root that follows is late. The message and the summary's
    count name the memory bound and both its options, each with its value (raising
    --max-open-spans alone would not have kept this trace)."""
    (chat, tool), root = trace_spans(0)
    big = json.dumps([{"role": "user", "parts": [{"type": "text", "content": "q" * 1_500_000}]}])
    prompt = {"key": "gen_ai.input.messages", "value": {"stringValue": big}}
    chat = {**chat, "attributes": [*chat["attributes"], prompt]}
    (tmp_path / "a.jsonl").write_text(line([chat, tool]) + "".join(whole(i) for i in range(1, 5)) + line([root]))
    source = FileSource([tmp_path])
    options = BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"], max_open_mb=1)
    state = BackfillState(job_id="bf-late-bytes", source=source.describe(), options=options)
    reporter = Messages()
    done = Backfill(source, state, None, reporter=reporter).run()
    assert (done.counters.late_roots, done.counters.late_roots_evicted, done.counters.evicted_traces) == (1, 1, 1)
    (message,) = [line for line in reporter.lines if "root span arrived after" in line]
    assert trace_id(0) in message
    assert "released early by the memory bound" in message
    assert "raise --max-open-spans, now 100,000, or --max-open-mb, now 1" in message


def test_a_trace_released_in_parts_by_the_byte_bound_counts_one_eviction(tmp_path: Path) -> None:
    """Trace 0's six chat spans of 600 kB each, a line each, then its root, under --max-open-mb 1:
    the trace goes over the bound three times, so three parts are released early. The summary
    counted each part as a trace released early: 3 beside 1 trace read."""
    (chat, _), root = trace_spans(0)
    big = json.dumps([{"role": "user", "parts": [{"type": "text", "content": "q" * 600_000}]}])
    prompt = {"key": "gen_ai.input.messages", "value": {"stringValue": big}}
    chats = [{**chat, "spanId": f"{0x100 + k:016x}", "attributes": [*chat["attributes"], prompt]} for k in range(6)]
    (tmp_path / "a.jsonl").write_text("".join(line([c]) for c in chats) + line([root]))
    source = FileSource([tmp_path])
    options = BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"], max_open_mb=1)
    state = BackfillState(job_id="bf-parts", source=source.describe(), options=options)
    counters = Backfill(source, state, None, reporter=Messages()).run().counters
    assert (counters.traces_read, counters.evicted_traces) == (1, 1)
    assert (counters.late_spans, counters.late_roots) == (4, 1)


def test_a_root_within_the_window_is_not_late(tmp_path: Path) -> None:
    """The same files with the default window: the trace is whole, nothing is late."""
    late_children, late_root = trace_spans(0)
    (tmp_path / "a.jsonl").write_text(line(late_children) + "".join(whole(i) for i in range(1, 31)))
    (tmp_path / "b.jsonl").write_text(line([late_root]))
    source = FileSource([tmp_path])
    options = BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"])
    state = BackfillState(job_id="bf-late", source=source.describe(), options=options)
    done = Backfill(source, state, None).run()
    assert done.counters.late_roots == 0
    assert done.counters.traces_read == 31


def test_a_trace_over_the_span_cap_keeps_its_root_when_it_ends_last() -> None:
    """10,050 spans, root last, cap 10,000: the root is kept (the old assembler dropped it, and
    the trace was released rootless); the 49 spans over the cap are dropped and counted."""
    children, root = trace_spans(5)
    chat, tool = children
    many = [{**tool, "spanId": f"{0xC000000000000000 + k:016x}"} for k in range(10_048)]
    spans = decode_otlp_records({"resourceSpans": [{"scopeSpans": [{"spans": [chat, *many, root]}]}]})
    assembler = TraceAssembler(window_spans=100)
    released = list(assembler.add(spans, Position(0, 1)))
    released += list(assembler.finish())
    (trace,) = released
    assert any(s.parent_span_id is None for s in trace.spans)
    assert len(trace.spans) == 10_001
    assert trace.dropped_spans == 49
    assert assembler.stats.late_roots == 0


def test_a_resumed_jobs_evictions_add_to_the_jobs_earlier_ones(tmp_path: Path) -> None:
    """Every counter of a job is cumulative over its runs but this one: a resume set it to its
    own evictions, so the summary put this run's figure beside the job's others (noticed)."""
    from tests.backfill._synth import write_otlp_files

    write_otlp_files(tmp_path, 40, files=1)
    source = FileSource([tmp_path])
    options = BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"], max_open_spans=2)
    state = BackfillState(job_id="bf-evict", source=source.describe(), options=options)
    state.counters.evicted_traces = 7  # (the job's runs before this one)
    backfill = Backfill(source, state, None, reporter=Messages())
    done = backfill.run()
    assert backfill.assembler.stats.evicted > 0
    assert done.counters.evicted_traces == 7 + backfill.assembler.stats.evicted


ROOT_AT = (2, 21, 0)  # where trace 0's root is read (file c, line 21)


def _late_root_files(directory: Path) -> Path:
    """Trace 0's children first, its root two files on and 20 lines into the third (past a
    50-span window; trace 0 is released without it at the end of file b); 91 traces."""
    late_children, late_root = trace_spans(0)
    return late_files(directory, late_children, [late_root])


@pytest.mark.parametrize("batches_after", [0, 1, 2])
def test_a_late_root_past_a_resumes_checkpoint_is_still_a_late_root(
    tmp_path: Path, redis_server: RedisServer, batches_after: int
) -> None:
    """Stopped after trace 0 went out without its root (and its root not yet read), then resumed:
    the resumed run met the root as a new trace (its assembler never saw trace 0 released), so
    the job counted 92 traces read and no late root, and sent the root as a run of its own, a
    second score of trace 0. Now the job counts and sends what it does without a stop."""

    def sent_late(submitter: CapturingSubmitter) -> bool:  # ``batches_after`` batches after trace 0's
        sent = [n for n, (batch, _) in enumerate(submitter.sent) if trace_id(0) in {r.trace_id for r in batch.requests}]
        return bool(sent) and len(submitter.sent) > sent[0] + batches_after

    job = stop_and_resume_in_process(_late_root_files(tmp_path / "in"), redis_server, DB, "bf-late-resume", sent_late)
    whole, resumed, submitter = job.whole, job.resumed, job.submitter
    assert (whole.counters.late_roots, whole.counters.traces_read) == (1, 91)
    assert (0, 1, 0) < job.checkpoint < ROOT_AT  # past trace 0's first line, before its root's

    assert resumed.counters.late_roots == 1
    assert resumed.counters.traces_read == 91
    assert sorted(submitter.runs) == sorted(job.uninterrupted.runs)  # the root is never a run of its own
    assert resumed.counters.runs_enqueued == whole.counters.runs_enqueued


def test_a_late_root_after_ctrl_c_and_resume_is_counted_once_and_never_enqueued(
    tmp_path: Path, private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line, a Ctrl-C (SIGINT) once trace 0 went out without its root, then
    ``--resume``: the job's summary counts the late root once and 91 traces, and trace 0's
    root is no run of the job (the resume enqueued it, and the workers scored trace 0 twice)."""
    directory = _late_root_files(tmp_path / "in")
    job = stop_and_resume(directory, private_redis, monkeypatch, ["--window-spans", "50"])
    assert (0, 1, 0) < tuple(job.saved["checkpoint"]) < ROOT_AT  # past trace 0's children, before its root
    assert f"{trace_id(0)}:{2:016x}" in job.runs_at_stop  # sent, without its root

    done = job.done
    assert (done["traces_read"], done["late_roots"], done["runs_enqueued"]) == (91, 1, 91)
    assert done["late_roots_by_option"] == {"--window-spans": 1}
    db = private_redis.client(0, decode_responses=True)
    assert db.scard(backfill_runs_key(job.job_id)) == 91
    assert not db.sismember(backfill_runs_key(job.job_id), f"{trace_id(0)}:{1:016x}")  # its root: no run


def test_a_late_root_of_a_trace_the_memory_bound_released_names_max_open_spans(
    tmp_path: Path, private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trace 0's children released rootless by the memory bound (one span: traces with their root
    go first, so only a bound under trace 0's two children releases them), its root read later
    (the default window would have kept it), stopped and resumed in between: the late root was
    said to want a wider --window-spans. Now the resumed job's summary and the trace's message
    name --max-open-spans (the job's list of traces read keeps why each was released)."""
    job = stop_and_resume(_late_root_files(tmp_path / "in"), private_redis, monkeypatch, ["--max-open-spans", "1"])
    assert (0, 1, 0) < tuple(job.saved["checkpoint"]) < ROOT_AT
    done = job.done
    assert done["evicted_traces"] > 0
    assert (done["late_roots"], done["late_roots_by_option"]) == (1, {"--max-open-spans": 1})
    late = [line for line in job.resumed.stderr.splitlines() if "root span arrived after" in line]
    (message,) = [line for line in late if trace_id(0) in line]
    (summary_line,) = [line for line in late if line.split()[:2] == ["late", "roots"]]
    for said in (message, summary_line):
        assert "--max-open-spans" in said
        assert "--window-spans" not in said


def test_a_late_root_in_a_run_scored_is_a_late_root_of_the_job(tmp_path: Path) -> None:
    """Trace 0's tool span read without its root (nothing to score), then, past the window, a part
    with two roots: ``POST /ask`` (which the tool span hangs under) and an LLM call of its own, a
    late run scored. The assembler counted a late root; the job counted none (a root of the part
    was in the run scored) and counted ``POST /ask`` as a late span. Now the job's summary counts
    the late root once, where late roots are counted (by option too), and no late span."""
    (chat, tool), root = trace_spans(0)
    root = {**root, "name": "POST /ask", "attributes": []}
    call = {k: v for k, v in chat.items() if k != "parentSpanId"}  # (a root of its own)
    directory = late_files(tmp_path / "in", [tool], [root, call])
    args = ["backfill", str(directory), "--scorers", "tests.backfill.scorers", "--scorer", "answer-words"]
    env = {"TRACESCORE_BROKER_URL": ""}
    for dry_run in ([], ["--dry-run"]):
        result = CliRunner().invoke(cli, [*args, "--window-spans", "50", "--json", *dry_run], env=env)
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        assert (summary["traces_read"], summary["late_runs"]) == (91, 1), dry_run
        assert (summary["late_roots"], summary["late_spans"]) == (1, 0), dry_run
        assert summary["late_roots_by_option"] == {"--window-spans": 1}
        assert "no_target" not in summary["traces_unreadable"]
        (said,) = [
            line for line in result.stderr.splitlines() if "root span arrived after" in line and trace_id(0) in line
        ]
        assert "--window-spans" in said
