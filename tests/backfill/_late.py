"""Inputs with a span or root that comes late for its trace, and a job of them stopped and
resumed, in process or by Ctrl-C through the command line (test_late_spans.py, test_late_roots.py),
and files of many late runs (test_redis.py: a job killed among them)."""

from __future__ import annotations

import contextlib
import itertools
import json
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from tests._redis import RedisServer
from tests.backfill._doubles import CapturingSubmitter, Messages, redis_job_store
from tests.backfill._synth import trace_id, trace_spans
from tracing.sources import FileSource, Position, SourceItem
from worker._keys import backfill_runs_key, backfill_state_key
from worker.backfill._driver import Backfill
from worker.backfill._state import BackfillOptions, BackfillState, RedisJobStore
from worker.cli import cli

SCORERS = ["--scorers", "tests.backfill.scorers", "--scorer", "answer-words"]


def line(spans: list[dict[str, Any]]) -> str:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"scope": {"name": "synth"}, "spans": spans}]}]}) + "\n"


def whole(i: int) -> str:
    children, root = trace_spans(i)
    return line([*children, root])


def late_files(directory: Path, early: list[dict[str, Any]], late: list[dict[str, Any]]) -> Path:
    """Trace 0's ``early`` spans on file a's first line, its ``late`` ones two files on, 20 lines
    into file c (past a 50-span window and two file boundaries); traces 1 to 90 whole between."""
    directory.mkdir()
    (directory / "a.jsonl").write_text(line(early) + "".join(whole(i) for i in range(1, 31)))
    (directory / "b.jsonl").write_text("".join(whole(i) for i in range(31, 61)))
    c = "".join(whole(i) for i in range(61, 81)) + line(late) + "".join(whole(i) for i in range(81, 91))
    (directory / "c.jsonl").write_text(c)
    return directory


SECOND_CALL_OF_0 = f"{0xAB:016x}"  # trace 0's late LLM call (late_llm_call_files)


def late_llm_call(i: int, second_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Trace ``i`` without an agent: a ``POST /ask`` root (neither agent nor LLM) and its chat
    span (the early spans), and a second top-level chat span ``second_id`` under the same root
    (the late one). Its runs are its top-level LLM calls: the late one is a whole run of its own."""
    (chat, _tool), root = trace_spans(i)
    root = {**root, "name": "POST /ask", "attributes": []}
    second = {**chat, "spanId": second_id, "name": "chat gpt-4o-mini (follow-up)"}
    return [chat, root], [second]


def late_llm_call_files(directory: Path, held_open: bool = False) -> Path:
    """Trace 0 (``late_llm_call``) in file a, its second chat span 20 lines into file c (past a
    50-span window and two file boundaries), which the read of trace 0 could not plan.

    ``held_open``: and files d and e of whole traces (91 to 150), so the late call, idle past a
    file boundary, is released at the end of file d and sent; with trace 200 open meanwhile
    (rootless, a tool span after every fifth line from file c's fifth to the end), which keeps a
    checkpoint saved then before the late call."""
    late_files(directory, *late_llm_call(0, SECOND_CALL_OF_0))
    if held_open:
        (_, tool), _ = trace_spans(200)
        spans = ({**tool, "spanId": f"{0xF000 + k:016x}"} for k in itertools.count())

        def holding(text: str) -> str:
            lines = text.splitlines(keepends=True)
            return "".join(at + (line([next(spans)]) if n % 5 == 4 else "") for n, at in enumerate(lines))

        (directory / "c.jsonl").write_text(holding((directory / "c.jsonl").read_text()))
        (directory / "d.jsonl").write_text(holding("".join(whole(i) for i in range(91, 121))))
        (directory / "e.jsonl").write_text(holding("".join(whole(i) for i in range(121, 151))))
    return directory


def many_late_llm_calls_files(directory: Path, late: int, lines: int = 150, gap: int = 25) -> list[tuple[str, str]]:
    """``late`` files of ``lines`` lines, file ``i`` holding trace ``i`` (``late_llm_call``) on
    its first line, its second chat span ``gap`` lines on (past a 50-span window), and whole
    traces (ids from 10,000) on the others; returns the late runs (trace id, span id). A late
    part has no root: the assembler holds it to a file boundary, so each file's comes with it."""
    directory.mkdir()
    filler = iter(range(10_000, 10_000 + late * lines))
    runs = []
    for i in range(late):
        second = f"{0xAB00 + i:016x}"
        early, after = late_llm_call(i, second)
        texts = [line(early), *(whole(next(filler)) for _ in range(gap - 1)), line(after)]
        texts += [whole(next(filler)) for _ in range(lines - gap - 1)]
        (directory / f"{i:02d}.jsonl").write_text("".join(texts))
        runs.append((trace_id(i), second))
    return runs


@dataclass(frozen=True)
class StoppedJob:
    """A job stopped by Ctrl-C and resumed: what the stop saved, and the resume's summary."""

    job_id: str
    saved: dict[str, Any]  # the job's state in Redis as the stop left it
    runs_at_stop: set[str]  # the job's runs enqueued (run ids) as the stop left them
    resumed: Result
    done: dict[str, Any]  # the resume's --json summary


def stop_and_resume(
    directory: Path, redis: RedisServer, monkeypatch: pytest.MonkeyPatch, options: Sequence[str] = ()
) -> StoppedJob:
    """Back ``directory`` up to ``redis`` (db 0, batches of 7, with ``options``), a Ctrl-C (SIGINT)
    on file c's tenth line, then ``--resume`` it with ``--no-wait``; both exit as they should."""
    read, runs = FileSource.read, []

    def interrupted_read(self: FileSource, start: Position | None = None) -> Iterator[SourceItem]:
        runs.append(start)
        for n, item in enumerate(read(self, start)):
            yield item
            if len(runs) == 1 and n == 72:  # (the first run only) file c's tenth line
                signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(FileSource, "read", interrupted_read)
    broker = ["--broker", redis.url(0), "--json", "--high-water", "1000", "--wait-timeout", "5"]
    env = {"TRACESCORE_BROKER_URL": ""}
    args = ["backfill", str(directory), *SCORERS, "--batch-size", "7", *options, *broker]
    stopped = CliRunner().invoke(cli, args, env=env)
    assert stopped.exit_code == 130, stopped.output
    job_id = json.loads(stopped.stdout.strip().splitlines()[-1])["job_id"]
    db = redis.client(0, decode_responses=True)
    saved = json.loads(db.get(backfill_state_key(job_id)) or "{}")
    runs_at_stop = {str(run) for run in db.smembers(backfill_runs_key(job_id))}

    resumed = CliRunner().invoke(cli, ["backfill", "--resume", job_id, "--no-wait", *broker], env=env)
    assert resumed.exit_code == 0, resumed.output
    done = json.loads(resumed.stdout.strip().splitlines()[-1])
    return StoppedJob(job_id, saved, runs_at_stop, resumed, done)


@dataclass(frozen=True)
class Resumed:
    """A job run whole, and the same job stopped and resumed in process."""

    whole: BackfillState
    uninterrupted: CapturingSubmitter  # the whole run's runs
    runs_at_stop: list[tuple[str, str]]  # the runs handed over before the stop
    saved: BackfillState  # the job's state as the stop saved it
    checkpoint: tuple[int, int, int]  # the stop's saved checkpoint, where the resume reads from
    resumed: BackfillState
    submitter: CapturingSubmitter  # the stopped run's runs, then the resume's
    said: tuple[list[str], list[str]]  # what the stopped run said, and what the resume said


def stop_and_resume_in_process(
    directory: Path,
    redis: RedisServer,
    db: int,
    job_id: str,
    should_stop: Callable[[CapturingSubmitter], bool],
    room: int | None = None,
) -> Resumed:
    """Back ``directory`` up whole (window 50 spans, batches of 7, of ``room`` bytes of requests
    a message when given), then again, stopped once ``should_stop`` (of what it handed over) says
    so, and resumed from what it saved in ``db`` of ``redis`` (emptied before and after)."""
    with contextlib.closing(redis_job_store(redis, db)) as stores:
        return _stop_and_resume(directory, next(stores), job_id, should_stop, room)


def _stop_and_resume(
    directory: Path,
    job_store: RedisJobStore,
    job_id: str,
    should_stop: Callable[[CapturingSubmitter], bool],
    room: int | None,
) -> Resumed:
    def state() -> BackfillState:
        options = BackfillOptions(
            scorers_module="tests.backfill.scorers", scorer_ids=["answer-words"], window_spans=50, batch_size=7
        )
        return BackfillState(job_id=job_id, source=FileSource([directory]).describe(), options=options)

    whole = state()
    uninterrupted = CapturingSubmitter(room)
    Backfill(FileSource([directory]), whole, uninterrupted, reporter=Messages()).run()

    submitter = CapturingSubmitter(room)
    said = (Messages(), Messages())
    first = Backfill(
        FileSource([directory]),
        state(),
        submitter,
        job_store=job_store,
        reporter=said[0],
        should_stop=lambda: should_stop(submitter),
    )
    with pytest.raises(KeyboardInterrupt):
        first.run()
    first.interrupted()
    runs_at_stop = list(submitter.runs)
    saved = job_store.load(job_id)
    assert saved is not None
    checkpoint = saved.checkpoint
    at_stop = saved.model_copy(deep=True)
    resumed = Backfill(FileSource([directory]), saved, submitter, job_store=job_store, reporter=said[1]).run()
    return Resumed(
        whole, uninterrupted, runs_at_stop, at_stop, checkpoint, resumed, submitter, (said[0].lines, said[1].lines)
    )
