"""A stopped and resumed job counts its input once, as the same job run without a stop does.

A resume reads again from the saved checkpoint: the traces and malformed lines between it and
the stop were counted by both runs (a job over 1,500 traces could say 1,520 read), and a trace
that began before the checkpoint and reached it was read again in part, as a fragment of its
own, counted and scored as a run the job never had. The interrupted summary printed the counts
in hand, ahead of the saved ones the resume goes on from.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._redis import RedisServer
from tests.backfill._doubles import CapturingSubmitter
from tests.backfill._synth import _line, trace_spans
from tracing.sources import FileSource
from worker.backfill._driver import Backfill
from worker.backfill._state import BackfillOptions, BackfillState, JobCounters, RedisJobStore

SCORERS = "tests.backfill.scorers"
DB = 11  # of the session's Redis: the other backfill tests use 10, 12, 13 and 15
TRACES = 200
MALFORMED_AT = (41, 121)  # lines (1-based) of the two malformed ones


def _interleaved(path: Path) -> Path:
    """200 traces, one a line with its chat span a line late (each line shares two traces), and
    two malformed lines among them."""
    lines, late = [], None
    for i in range(TRACES):
        (chat, tool), root = trace_spans(i)
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


def _input_counts(counters: JobCounters) -> dict[str, Any]:
    """What a job counts of its input (not of its runs, which a resume reads again apart)."""
    return counters.model_dump(
        include={"traces_read", "malformed", "skipped", "unreadable", "late_roots", "evicted_traces", "spans_dropped"}
    ) | {"malformed_where": sorted(counters.malformed_where)}


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RedisJobStore]:
    client = redis_server.client(DB, decode_responses=True)
    client.flushdb()
    try:
        yield RedisJobStore(client)
    finally:
        client.flushdb()
        client.close()


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

    state = _state(path, batch_size=7, window_spans=window)
    submitter = CapturingSubmitter()
    first = Backfill(
        FileSource([path]),
        state,
        submitter,
        job_store=store,
        should_stop=lambda: state.counters.runs_enqueued >= stop_after,
    )
    with pytest.raises(KeyboardInterrupt):
        first.run()
    first.interrupted()
    saved = store.load(state.job_id)
    assert saved is not None
    assert saved.checkpoint != (0, 0, 0)
    resumed = Backfill(FileSource([path]), saved, submitter, job_store=store).run()

    assert _input_counts(resumed.counters) == _input_counts(whole.counters)
    assert sorted(submitter.runs) == sorted(uninterrupted.runs)  # each once, no fragment of its own
    assert resumed.counters.runs_enqueued == whole.counters.runs_enqueued
