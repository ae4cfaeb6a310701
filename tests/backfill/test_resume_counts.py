"""A stopped and resumed job counts its input once, as the same job run without a stop does.

A resume reads again from the saved checkpoint: the traces and malformed lines between it and
the stop were counted by both runs (a job over 1,500 traces could say 1,520 read), and a trace
that began before the checkpoint and reached it was read again in part, as a fragment of its
own, counted and scored as a run the job never had. The interrupted summary printed the counts
in hand, ahead of the saved ones the resume goes on from.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests._redis import RedisServer
from tests.backfill._doubles import CapturingSubmitter, redis_job_store
from tests.backfill._synth import _line, trace_spans
from tests.backfill.faketempo import FakeTempo
from tracing.sources import FileSource, Position, SourceItem, TraceSource
from worker._keys import backfill_state_key
from worker.backfill._driver import Backfill
from worker.backfill._state import BackfillOptions, BackfillState, JobCounters, RedisJobStore
from worker.cli import cli

SCORERS = "tests.backfill.scorers"
DB = 11  # of the session's Redis: the other backfill tests use 10, 12, 13 and 15
TRACES = 200
MALFORMED_AT = (41, 121)  # lines (1-based) of the two malformed ones


def _interleaved(path: Path, padded: int = 0) -> Path:
    """200 traces, one a line with its chat span a line late (each line shares two traces), and
    two malformed lines among them; ``padded``: every tenth trace's answer (from the fifth) is that many
    characters."""
    lines, late = [], None
    for i in range(TRACES):
        (chat, tool), root = trace_spans(i)
        if padded and i % 10 == 5:
            long = json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "x" * padded}]}])
            output = {"key": "gen_ai.output.messages", "value": {"stringValue": long}}
            chat = {**chat, "attributes": [*chat["attributes"], output]}
        lines.append(_line([root, tool, *([late] if late else [])]))
        late = chat
    lines.append(_line([late]))
    for at in MALFORMED_AT:
        lines.insert(at - 1, "not json\n")
    path.write_text("".join(lines))
    return path


def _state(path: Path, **options: Any) -> BackfillState:
    return BackfillState(
        job_id="bf-counts",
        source=FileSource([path]).describe(),
        options=BackfillOptions(scorers_module=SCORERS, scorer_ids=["answer-words"], **options),
    )


def _stopped(
    source: TraceSource, state: BackfillState, submitter: CapturingSubmitter, store: RedisJobStore, runs: int
) -> BackfillState:
    """``state``'s job read from ``source`` until ``runs`` runs are enqueued, then stopped (as
    Ctrl-C stops it) and marked resumable: the state it saved, which a resume goes on from."""
    first = Backfill(
        source, state, submitter, job_store=store, should_stop=lambda: state.counters.runs_enqueued >= runs
    )
    with pytest.raises(KeyboardInterrupt):
        first.run()
    first.interrupted()
    saved = store.load(state.job_id)
    assert saved is not None
    return saved


def _input_counts(counters: JobCounters) -> dict[str, Any]:
    """What a job counts of its input (not of its runs, which a resume reads again apart)."""
    return counters.model_dump(
        include={"traces_read", "malformed", "skipped", "unreadable", "late_roots", "evicted_traces", "spans_dropped"}
    ) | {"malformed_where": sorted(counters.malformed_where)}


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RedisJobStore]:
    yield from redis_job_store(redis_server, DB)


@pytest.mark.parametrize("stop_after", [30, 100, 160])
@pytest.mark.parametrize("window", [10, 100])
def test_a_stop_and_resume_count_the_input_once(
    tmp_path: Path, store: RedisJobStore, stop_after: int, window: int
) -> None:
    """Stopped after ``stop_after`` runs went out (batches of 7, which end inside lines), then
    resumed: the job's counts and runs are those of the job run without a stop."""
    path = _interleaved(tmp_path / "t.jsonl")
    whole = _state(path, batch_size=7, window_spans=window)
    uninterrupted = CapturingSubmitter()
    Backfill(FileSource([path]), whole, uninterrupted).run()
    assert (whole.counters.traces_read, whole.counters.malformed) == (TRACES, len(MALFORMED_AT))

    submitter = CapturingSubmitter()
    saved = _stopped(FileSource([path]), _state(path, batch_size=7, window_spans=window), submitter, store, stop_after)
    assert saved.checkpoint != (0, 0, 0)
    resumed = Backfill(FileSource([path]), saved, submitter, job_store=store).run()

    assert _input_counts(resumed.counters) == _input_counts(whole.counters)
    assert sorted(submitter.runs) == sorted(uninterrupted.runs)  # each once, no fragment of its own
    assert resumed.counters.runs_enqueued == whole.counters.runs_enqueued


def test_the_interrupted_summary_says_what_was_saved_and_the_resume_adds_up(
    tmp_path: Path, private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C between two batches: the summary printed the traces and malformed lines read since
    the last save (counted again by the resume). It prints the saved state's counts now, and
    the resumed job's add up to the input."""
    path = _interleaved(tmp_path / "t.jsonl")
    read, runs = FileSource.read, []

    def interrupted_read(self: FileSource, start: Position | None = None) -> Iterator[SourceItem]:
        runs.append(start)
        for n, item in enumerate(read(self, start)):
            yield item
            if len(runs) == 1 and n == 60:  # (the first run only) a Ctrl-C between two batches
                signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(FileSource, "read", interrupted_read)
    broker = ["--broker", private_redis.url(0), "--json", "--high-water", "1000", "--wait-timeout", "5"]
    options = ["--scorers", SCORERS, "--scorer", "answer-words", "--batch-size", "7", "--window-spans", "100"]
    stopped = CliRunner().invoke(cli, ["backfill", str(path), *options, *broker], env={"TRACESCORE_BROKER_URL": ""})
    assert stopped.exit_code == 130, stopped.output
    summary = json.loads(stopped.stdout.strip().splitlines()[-1])
    assert summary["status"] == "interrupted"
    db = private_redis.client(0, decode_responses=True)
    saved = json.loads(db.get(backfill_state_key(summary["job_id"])) or "{}")["counters"]
    assert 0 < saved["traces_read"] < TRACES
    said = (summary["traces_read"], summary["malformed_lines"], summary["runs_enqueued"])
    assert said == (saved["traces_read"], saved["malformed"], saved["runs_enqueued"])
    assert summary["this_run"]["traces_read"] == saved["traces_read"]

    resumed = CliRunner().invoke(
        cli, ["backfill", "--resume", summary["job_id"], "--no-wait", *broker], env={"TRACESCORE_BROKER_URL": ""}
    )
    assert resumed.exit_code == 0, resumed.output
    done = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert (done["traces_read"], done["malformed_lines"], done["runs_enqueued"]) == (TRACES, 2, TRACES)
    assert done["this_run"]["traces_read"] == TRACES - saved["traces_read"]


def test_a_tempo_search_warning_is_counted_once_by_a_resume_inside_its_window(store: RedisJobStore) -> None:
    """A Tempo search's warning (search results whose trace id is not hex) was given at the
    start of its window, before the checkpoint of a job stopped inside it: the resume searched
    the window again and counted the warning a second time (2 malformed of 1)."""
    from tests.backfill._synth import BASE_NS
    from tests.backfill.test_tempo import STEP_NS, _trace
    from tracing.sources import TempoSource

    tempo = FakeTempo().start()
    try:
        for i in range(40):
            tempo.add(_trace(i))
        tempo.extra_search_entries = [{"traceID": "not-hex"}]

        def source() -> TempoSource:
            return TempoSource(tempo.url, since_ns=BASE_NS, until_ns=BASE_NS + 40 * STEP_NS, window_s=3600)

        def state() -> BackfillState:
            options = BackfillOptions(scorers_module=SCORERS, scorer_ids=["answer-words"], batch_size=7)
            return BackfillState(job_id="bf-tempo", source=source().describe(), options=options)

        whole = state()
        uninterrupted = CapturingSubmitter()
        Backfill(source(), whole, uninterrupted).run()
        assert (whole.counters.traces_read, whole.counters.malformed) == (40, 1)

        submitter = CapturingSubmitter()
        saved = _stopped(source(), state(), submitter, store, 14)
        assert saved.checkpoint[0] == 0  # the one window
        assert saved.checkpoint[1] > 1  # past its start, where the warning was given
        resumed = Backfill(source(), saved, submitter, job_store=store).run()
    finally:
        tempo.stop()
    assert _input_counts(resumed.counters) == _input_counts(whole.counters)
    assert sorted(submitter.runs) == sorted(uninterrupted.runs)


@pytest.mark.parametrize("padded", [0, 10_000])
@pytest.mark.parametrize("stop_after", [12, 60, 120])
@pytest.mark.parametrize("window", [10, 100])
def test_a_resume_after_a_batch_cut_by_bytes_counts_each_run_read_once(
    tmp_path: Path, store: RedisJobStore, stop_after: int, window: int, padded: int
) -> None:
    """Batches cut by bytes (four requests a message): the cutter closes a batch while adding a
    trace's request, and the state saved then counted that trace's runs as read though they were
    not sent (the resume reads them again, as runs it never had, and counted them read again);
    as it did a run rejected as too large (``padded``: every tenth) past the checkpoint.
    ``runs_read - runs_read_again`` was high by those runs; it is the job's runs, with a stop or
    without, and the saved state's is the runs sent before the stop and those rejected before
    its checkpoint."""
    path = _interleaved(tmp_path / "t.jsonl", padded)
    whole = _state(path, batch_size=1000, window_spans=window)
    uninterrupted = CapturingSubmitter(8000)
    Backfill(FileSource([path]), whole, uninterrupted).run()
    assert len(uninterrupted.sent) > 10
    assert (whole.counters.runs_read, whole.counters.runs_read_again) == (TRACES, 0)
    assert whole.counters.runs_rejected == ({"too_large": TRACES // 10} if padded else {})

    submitter = CapturingSubmitter(8000)
    state = _state(path, batch_size=1000, window_spans=window)
    saved = _stopped(FileSource([path]), state, submitter, store, stop_after)
    rejected = saved.counters.runs_rejected.get("too_large", 0)
    assert saved.counters.runs_read - saved.counters.runs_read_again == len(set(submitter.runs)) + rejected
    resumed = Backfill(FileSource([path]), saved, submitter, job_store=store).run()

    assert sorted(submitter.runs) == sorted(uninterrupted.runs)
    counters = resumed.counters
    assert counters.runs_read - counters.runs_read_again == whole.counters.runs_read
    assert (counters.runs_enqueued, counters.runs_rejected) == (
        whole.counters.runs_enqueued,
        whole.counters.runs_rejected,
    )
