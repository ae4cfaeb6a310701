"""worker._embedded: the in-process scorer behind backfill's embedded mode and the exporter's sink."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tests.backfill._synth import trace_spans, write_otlp_files
from tests.fakellm import FakeLLMServer, Reply
from tests.tracing._spans import chat_attributes
from tests.worker._workers import wait_for
from tracing import MemoryScoreWriter, ScoringRule, ScoringSpanExporter, Sink
from tracing.otlp import decode_otlp_records
from tracing.queue import ScoreBatch, ScoreRequest
from tracing.read import plan_runs
from tracing.sources import FileSource
from worker._embedded import EmbeddedScorer, embedded_sink
from worker._registry import load_registry
from worker._summary import ScoreTable, Summary, SummaryScoreWriter
from worker.backfill._state import BackfillOptions, BackfillState


def _batch(n: int, job_id: str = "job-1") -> ScoreBatch:
    requests = []
    for i in range(n):
        children, root = trace_spans(i)
        records = decode_otlp_records({"resourceSpans": [{"scopeSpans": [{"spans": [*children, root]}]}]})
        ((target, members),) = plan_runs(records)
        requests.append(
            ScoreRequest(
                spans=members,
                target_span_ids=[target.span_id],
                scorer_ids=["answer-words", "confident"],
                source="backfill",
                job_id=job_id,
            )
        )
    return ScoreBatch(batch_id=f"{job_id}-0", requests=requests)


def _app(
    sink: Sink, scorer_ids: list[str], *, shutdown_timeout_s: float
) -> tuple[ScoringSpanExporter, TracerProvider, Callable[[str, str], None]]:
    """An app whose exporter sends to ``sink`` every run for ``scorer_ids``: the exporter, its
    provider, and ``one(question, answer)``, which makes one agent trace."""
    exporter = ScoringSpanExporter(
        [ScoringRule(scorer_ids)],
        sink,
        grace_s=0.0,
        processor_delay_s=0.0,
        flush_interval_s=0.05,
        shutdown_timeout_s=shutdown_timeout_s,
    )
    provider = TracerProvider(resource=Resource({"service.name": "shop"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("app")
    agent = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "helper"}

    def one(question: str, answer: str) -> None:
        with (
            tracer.start_as_current_span("invoke_agent helper", attributes=agent),
            tracer.start_as_current_span("chat m", attributes=chat_attributes(question, answer)),
        ):
            pass

    return exporter, provider, one


def test_embedded_scorer_scores_once_and_counts_the_job() -> None:
    """A batch is scored in process; submitting it again writes nothing new (deterministic ids)."""
    writer = MemoryScoreWriter()
    scorer = EmbeddedScorer(load_registry("tests.backfill.scorers"), writer)
    batch = _batch(10)
    scorer.submit(batch)
    scorer.submit(batch)
    progress = scorer.progress("job-1")
    scorer.close()
    assert len(writer.records) == 20
    assert len({r.score_id for r in writer.records}) == 20
    assert progress["scored"] == 18
    assert progress["failed:ValueError"] == 2  # "confident" refuses the two "not sure" answers
    assert scorer.totals.skipped["already_scored"] == 20


def test_table_writer_shows_agent_scorer_score_and_reason() -> None:
    """The table names the agent (from the run), the scorer, the score and a shortened reason."""
    stream = io.StringIO()
    agents: dict[str, str] = {}
    registry = load_registry("tests.backfill.scorers")
    table = ScoreTable(stream, traces=True, width=100)
    scorer = EmbeddedScorer(registry, SummaryScoreWriter(Summary(registry), table, agents), agents=agents)
    scorer.submit(_batch(5))
    scorer.close()
    lines = stream.getvalue().splitlines()
    assert lines[0].split() == ["trace", "agent", "scorer", "score", "reason"]
    assert len(lines) == 2 + 10
    assert all(len(line) <= 100 for line in lines)
    assert any(
        "weather-agent" in line and "answer-words" in line and "0.400" in line and "8 words" in line for line in lines
    )
    assert any("confident" in line and "error" in line and "ValueError" in line for line in lines)
    assert agents == {}  # labels are dropped once their batch is written


def test_embedded_sink_scores_what_the_exporter_captures() -> None:
    """ScoringSpanExporter with embedded_sink scores finished agent traces in this process."""
    writer = MemoryScoreWriter()
    exporter = ScoringSpanExporter(
        [ScoringRule(["answer-words"])],
        embedded_sink("tests.backfill.scorers", writer),
        grace_s=0.0,
        flush_interval_s=0.05,
    )
    provider = TracerProvider(resource=Resource({"service.name": "shop"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("app")
    chat = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "Hi there?"}]}]),
        "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": "Hello, how can I help?"}]}]
        ),
    }
    agent = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "helper"}
    with (
        tracer.start_as_current_span("invoke_agent helper", attributes=agent),
        tracer.start_as_current_span("chat m", attributes=chat),
    ):
        pass
    deadline = time.monotonic() + 10
    while not writer.records and time.monotonic() < deadline:
        exporter.force_flush(1000)
        time.sleep(0.02)
    provider.shutdown()
    (record,) = writer.records
    assert record.scorer_id == "answer-words"
    assert record.score == 0.25
    assert record.source == "live"


def test_embedded_sink_does_not_read_the_workers_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sink runs inside the application: a TRACESCORE_* value meant for (or broken for) the
    workers does not stop the app's exporter from being built; the run timeout is an argument."""
    monkeypatch.setenv("TRACESCORE_RUN_TIMEOUT_SECONDS", "not-a-number")
    sink = embedded_sink("tests.backfill.scorers", MemoryScoreWriter(), run_timeout_s=5.0)
    sink.close()


def test_an_apps_embedded_sink_keeps_the_newest_scores_only() -> None:
    """The app's in-process sink lives as long as the app: its store kept every score (about 4 KB
    each, 4 GB a day at a million scores), never freed. It keeps the newest
    EMBEDDED_RECORDS_KEPT now; the writer gets every score, and a run sent again soon after is
    still known as scored."""
    from tests.worker._batches import batch
    from tests.worker.sample_scorers import length
    from worker._embedded import EMBEDDED_RECORDS_KEPT
    from worker.store import MemoryScoreStore

    writer = MemoryScoreWriter()
    sink = embedded_sink({"length": length}, writer, run_timeout_s=0)
    try:
        runs = EMBEDDED_RECORDS_KEPT + 500
        for n in range(0, runs, 100):
            sink.send(batch(range(n, n + 100), ["length"], salt="kept"))
        store = sink.scorer.store
        assert isinstance(store, MemoryScoreStore)
        assert len(store.records) == EMBEDDED_RECORDS_KEPT
        assert len(writer.records) == runs
        sink.send(batch(range(runs - 100, runs), ["length"], salt="kept"))  # the newest, again
        assert len(writer.records) == runs
    finally:
        sink.close()


def test_an_embedded_sink_in_a_forked_process_refuses_at_once_and_shuts_down() -> None:
    """A process forked from an app whose exporter sends to embedded_sink: the child has the
    exporter's threads again but not the scorer's event loop. Its send waited for good, holding
    the scorer's lock, and the child's shutdown hung on that lock. Each batch is refused at once
    now (counted as send_failed), and the child's shutdown returns."""
    from tests._forked import in_forked_child

    writer = MemoryScoreWriter()
    sink = embedded_sink("tests.backfill.scorers", writer, run_timeout_s=5)
    exporter, provider, app_run = _app(sink, ["answer-words"], shutdown_timeout_s=3)

    def one() -> None:
        app_run("Hi there?", "Hello, how can I help?")

    one()
    assert wait_for(lambda: len(writer.records) == 1, 10)

    def in_the_child() -> dict[str, Any]:
        one()
        refused = wait_for(lambda: exporter.stats()["dropped"].get("send_failed") == 1, 10)
        started = time.monotonic()
        provider.shutdown()
        return {"refused": refused, "shutdown_s": time.monotonic() - started, "records": len(writer.records)}

    try:
        child, _ = in_forked_child(in_the_child)  # a child that hangs is killed: the failure this test is about
        assert child.get("refused") is True, child
        assert child["shutdown_s"] < 5
        assert child["records"] == 1  # the parent's score only: nothing scored in the child
        one()
        assert wait_for(lambda: len(writer.records) == 2, 10)  # the parent scores on
    finally:
        provider.shutdown()


def test_shutdown_ends_an_embedded_sinks_retry_backoff_and_says_what_it_left(
    fake_llm: FakeLLMServer,
) -> None:
    """An embedded sink whose batch had a transient judge failure waited out its retry's backoff
    when the app shut down (up to 3 s with embedded_sink's defaults, here 30 s), holding the
    app's exit. Now shutdown ends the wait and starts no retry, as a command's first Ctrl-C: the
    pairs that waited are not scored, nor recorded as failed, and the sink logs how many (no
    agent content); the rest is scored as before, and the exporter drops nothing."""
    from structlog.testing import capture_logs

    from worker._embedded import EmbeddedSink
    from worker._settings import Settings

    fake_llm.rule(Reply.error(503, "overloaded"), user_contains="PLAIN")
    registry = load_registry("tests.worker.budget_scorers")
    writer = MemoryScoreWriter()
    settings = Settings.model_construct(retry_budget=1, retry_backoff_seconds=30.0)
    scorer = EmbeddedScorer({s: registry[s] for s in ("costly", "plain")}, writer, settings=settings, run_timeout_s=30)
    shutdown_timeout_s = 10.0
    exporter, provider, app_run = _app(EmbeddedSink(scorer), ["costly", "plain"], shutdown_timeout_s=shutdown_timeout_s)

    def one(question: str) -> None:
        app_run(question, "Secret answer text.")

    def plain_asked() -> int:
        return sum("PLAIN" in r.user_text for r in fake_llm.requests)

    try:
        one("First secret question?")
        # Its first try done: "costly" scored, "plain" answered 503 and waiting for its retry.
        assert wait_for(lambda: plain_asked() == 1 and len(writer.records) == 1, 20)
        one("Second secret question?")  # queued behind the batch in its backoff
        with capture_logs() as logs:
            started = time.monotonic()
            provider.shutdown()
            took = time.monotonic() - started
    finally:
        provider.shutdown()
    assert took < shutdown_timeout_s, f"shutdown waited {took:.1f} s: the retry's backoff held it"
    # The second trace was scored once (its own first try), the first one not retried.
    assert plain_asked() == 2
    assert sorted(r.scorer_id for r in writer.records) == ["costly", "costly"]
    stats = exporter.stats()
    assert (stats["runs_sent"], stats["dropped"]) == (2, {})
    (said,) = [e for e in logs if e["event"] == "embedded_sink_not_scored"]
    assert (said["pairs"], said["by_scorer"]) == (2, {"plain": 2})
    assert "secret" not in json.dumps(logs, default=str).lower()


@pytest.mark.parametrize(
    "slow", ["sink.send", "scorer.score"], ids=["before-the-scorer-holds-it", "held-not-yet-scored"]
)
def test_a_batch_handed_over_as_the_shutdown_deadline_passes_is_named_once_and_not_scored(slow: str) -> None:
    """The exporter's shutdown closes the sink once its deadline passed, while the sender may be
    handing a batch over. A batch the scorer held and had not begun was logged as not scored,
    then scored on the closed scorer (its loop closed: RuntimeError); one not yet held was
    neither logged nor scored. Here the hand-over is held up (at the sink, or in the scorer
    before it scores) until shutdown has returned: the closed scorer refuses the batch
    (ScorerClosedError), which is named once as not scored, and nothing of it is scored."""
    from structlog.testing import capture_logs

    writer = MemoryScoreWriter()
    sink = embedded_sink("tests.backfill.scorers", writer, run_timeout_s=5)
    exporter, provider, one = _app(sink, ["answer-words", "confident"], shutdown_timeout_s=0.3)
    owner, method = (sink, "send") if slow == "sink.send" else (sink.scorer, "score")
    handing = getattr(owner, method)
    entered, go = threading.Event(), threading.Event()
    ended: list[BaseException | None] = []

    def slow_hand_over(batch: ScoreBatch) -> Any:
        entered.set()
        go.wait(30)
        try:
            result = handing(batch)
        except BaseException as exc:
            ended.append(exc)
            raise
        ended.append(None)
        return result

    setattr(owner, method, slow_hand_over)
    try:
        with capture_logs() as logs:
            one("Secret question?", "Secret answer text.")
            assert entered.wait(10), "the batch never reached the sink"
            provider.shutdown()  # its deadline passes while the batch is being handed over
            go.set()
            assert wait_for(lambda: not exporter._sender.is_alive(), 10), "the sender never ended"
    finally:
        go.set()
        provider.shutdown()
    said = [e for e in logs if e["event"] == "embedded_sink_not_scored"]
    assert (len(writer.records), sum(e["pairs"] for e in said)) == (0, 2), (writer.records, said)
    assert said[0]["by_scorer"] == {"answer-words": 1, "confident": 1}
    assert "secret" not in json.dumps(logs, default=str).lower()
    assert [type(e).__name__ for e in ended] == ["ScorerClosedError"], ended
    stats = exporter.stats()
    assert (stats["runs_sent"], stats["dropped"]) == (0, {"shutdown_unsent": 1})
    assert {e["error"] for e in logs if e["event"] == "sink_send_failed"} <= {"ScorerClosedError"}


def test_a_sink_closed_by_hand_refuses_each_batch_once_and_the_exporter_goes_on() -> None:
    """An ``embedded_sink`` closed by the app's own hand while its exporter still runs: each batch
    handed over after is refused for good (``ScorerClosedError``), named once as not scored and
    counted as ``send_failed``; the sender goes on to the next. It was a failed send, retried
    with backoff for as long as the exporter lived: the same batch named again on every retry,
    and every batch behind it stuck."""
    from structlog.testing import capture_logs

    writer = MemoryScoreWriter()
    sink = embedded_sink("tests.backfill.scorers", writer, run_timeout_s=5)
    exporter, provider, one = _app(sink, ["answer-words", "confident"], shutdown_timeout_s=2.0)
    with capture_logs() as logs:
        try:
            sink.close()
            one("Secret question?", "Secret answer text.")
            one("Secret other question?", "Secret other answer.")
            # Both runs settled as refused (the second was queued behind the first).
            assert wait_for(lambda: exporter.stats()["dropped"].get("send_failed") == 2, 10), exporter.stats()
            time.sleep(0.5)  # (a retry would come within 0.1-0.2 s: give one the chance to show)
            stats = exporter.stats()
        finally:
            provider.shutdown()  # closes the sink again: a no-op
    said = [e for e in logs if e["event"] == "embedded_sink_not_scored"]
    refused = [e for e in logs if e["event"] == "sink_refused_batch"]
    # Each batch (one or both runs) named once: the two traces' four pairs, each trace once.
    assert sum(e["pairs"] for e in said) == 4, said
    assert sorted(t for e in said for t in e["trace_ids"]) == sorted({t for e in said for t in e["trace_ids"]})
    assert len(said) == len(refused), refused
    assert {e["error"] for e in refused} == {"ScorerClosedError"}, refused
    assert not [e for e in logs if e["event"] == "exporter_sink_close_failed"], logs
    assert not [e for e in logs if e["event"] == "sink_send_failed"], logs
    assert (stats["runs_sent"], stats["send_failures"], stats["dropped"]) == (0, 0, {"send_failed": 2})
    assert writer.records == []
    assert "secret" not in json.dumps(logs, default=str).lower()


def _embedded_job(traces: Path, job_id: str, *, batch_size: int) -> tuple[FileSource, BackfillState, EmbeddedScorer]:
    """An embedded backfill of the files in ``traces`` with two scorers: its source, its state
    and the in-process scorer (``answer-words`` and ``confident``, which fails "not sure")."""
    source = FileSource(sorted(traces.iterdir()))
    scorer_ids = ["answer-words", "confident"]
    options = BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=scorer_ids, batch_size=batch_size)
    state = BackfillState(job_id=job_id, source=source.describe(), options=options)
    registry = load_registry("tests.backfill.scorers")
    return source, state, EmbeddedScorer({s: registry[s] for s in scorer_ids}, MemoryScoreWriter())


def test_a_stop_as_a_batch_is_handed_over_leaves_its_pairs_named_and_counted(tmp_path: Path) -> None:
    """A second Ctrl-C landing after the driver counted a batch's runs as enqueued and before
    the scorer began on it (here: its scoring raises KeyboardInterrupt before doing anything)
    left the batch's pairs neither scored nor named and counted as interrupted: the summary's
    expected scores were more than it accounted for. The scorer holds a batch as unfinished
    from the start of the hand-over now, so its pairs are named and counted (skipped:
    interrupted), and every expected score is accounted for."""
    from worker.backfill._driver import Backfill

    write_otlp_files(tmp_path, 5, files=1, compress=False)
    source, state, scorer = _embedded_job(tmp_path, "bf-cut", batch_size=10)
    scorer_ids = list(scorer.deps.registry)

    def interrupted(batch: ScoreBatch) -> Any:
        raise KeyboardInterrupt  # the second Ctrl-C, before any of the batch is scored

    scorer.score = interrupted  # type: ignore[method-assign]
    backfill = Backfill(source, state, scorer)
    try:
        with pytest.raises(KeyboardInterrupt):
            backfill.run()
        backfill.not_handed_over()
        left = scorer.interrupted_pairs()
        progress = scorer.progress("bf-cut")
    finally:
        scorer.close()
    assert state.counters.runs_enqueued == 5
    assert sorted(scorer_id for _, _, scorer_id in left) == sorted(scorer_ids * 5)
    assert progress.get("skipped:interrupted") == 10 == state.expected_scores


def _ctrl_c_twice_at(traces: Path, at: int) -> tuple[BackfillState, bool, list[tuple[str, str, str]], dict[str, int]]:
    """An embedded backfill of ``traces`` (batches of 2 runs), wired to its signals as the command
    wires them, with Ctrl-C pressed twice before line ``at`` of its hand-overs (counted over
    the lines the driver's ``_flush`` and the scorer's ``submit`` run): the job's state, whether
    the signal stopped it, the pairs the scorer named and the job's counts, after the command's
    steps of a stop (``not_handed_over``, ``settle``, ``interrupted_pairs``)."""
    import signal
    import sys
    from types import FrameType

    from worker._interrupt import StopSignal
    from worker.backfill._driver import Backfill

    source, state, scorer = _embedded_job(traces, f"bf-{at}", batch_size=2)
    stop = StopSignal("batch")
    hand_over = {Backfill._flush.__code__, EmbeddedScorer.submit.__code__}
    lines = 0

    def line(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal lines
        if event == "line":
            lines += 1
            if lines == at:  # (before the line runs, as a signal's handler runs between two)
                stop.handle(signal.SIGINT, frame)  # the first asks
                stop.handle(signal.SIGINT, frame)  # the second stops at once (or at a deferral's end)
        return line

    def call(frame: FrameType, event: str, arg: object) -> Any:
        return line if frame.f_code in hand_over else None

    scorer.should_stop = stop
    backfill = Backfill(source, state, scorer, should_stop=stop, hand_over=stop.deferred)
    previous = sys.gettrace()
    sys.settrace(call)
    try:
        interrupted = stop.run(backfill.run)
    finally:
        sys.settrace(previous)
    try:
        if interrupted:
            backfill.not_handed_over()
        scorer.settle()
        left = scorer.interrupted_pairs()
        progress = scorer.progress(state.job_id)
    finally:
        scorer.close()
    return state, interrupted, left, progress


def test_a_second_ctrl_c_anywhere_in_a_batchs_hand_over_leaves_every_trace_and_pair_named(tmp_path: Path) -> None:
    """Ctrl-C twice, the second landing at each line of a batch's hand-over in turn, from the
    driver taking its chunk (``_flush``) to the scorer holding the batch (``submit``), where a
    signal's handler (``StopSignal.handle``, as ``stop_on_signals`` installs it) may run. Landing
    after the driver had emptied its chunk and before the scorer's first line, the batch's traces
    were neither in the chunk (named by ``not_handed_over``) nor held by the scorer (named by
    ``interrupted_pairs``): not named, and the traces or the scores of the summary did not add up.
    The hand-over defers a second signal now until the scorer holds the batch: wherever it lands,
    each trace read is handed over or named, and each score expected is recorded or named."""
    write_otlp_files(tmp_path, 5, files=1, compress=False)
    for at in range(1, 1000):
        state, interrupted, left, progress = _ctrl_c_twice_at(tmp_path, at)
        counters = state.counters
        where = f"the second Ctrl-C before line {at} of the hand-overs"
        assert counters.traces_read == 5, where
        assert counters.traces_enqueued + counters.skipped.get("interrupted", 0) == 5, where
        recorded = progress.get("scored", 0) + progress.get("failed", 0)
        assert recorded + len(left) == state.expected_scores, where
        assert progress.get("skipped:interrupted", 0) == len(left), where
        if not interrupted:  # past the last line of the last hand-over: the job ran through
            assert recorded == 10
            return
    raise AssertionError("the job never ran through: more lines than the hand-overs have")
