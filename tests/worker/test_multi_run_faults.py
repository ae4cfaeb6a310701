"""Requests of several runs under real-time traffic and a Redis restart, end to end.

An application thread makes traces of 2 or 3 agent runs each — a trickle, a flood, a second
flood during which Redis is SIGKILLed, then a trickle while it comes back — through the real
``ScoringSpanExporter`` behind a real ``BatchSpanProcessor`` (no ``force_flush``: the exporter's
own threads hand everything off) into a persistent private Redis, consumed by two real worker
processes (prefork and threads pools). What the README promises, checked run by run:

- every run whose request Redis acknowledged is scored once per scorer, with its own span name
  and its own content, and no record is an error; nothing is dead-lettered; the queue and the
  unacknowledged messages settle to 0;
- every run the exporter could not hand off is counted by it under a named reason: runs
  acknowledged + runs counted as dropped == every run the application made.

The hand-off queue is small (``queue_size``) so that the flood while Redis is down must overflow
it: the drops are not a possibility the test tolerates but a path it takes on every run.

A worker that exits is restarted here as a deployment's supervisor would, so the delivery
promises above are checked whatever happens to a worker; the second test asserts the workers stay
up (a consumer used to die on the disconnect: ``worker._guard``'s channel, and
``test_redis_restart``'s deterministic test of it).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

from tests._redis import RedisServer
from tests.worker._multi_run_app import AckedSink, MultiRunApp, Phase, Traffic
from tests.worker._workers import WorkerProcess, read_scores, wait_for
from tracing import CelerySink, ScoringRule, ScoringSpanExporter
from tracing._score_record import score_id_for
from worker.store import DeadLetter

SCORERS = ("length", "slow")
QUEUE_SIZE = 400  # runs; the flood while Redis is down makes ~675, so some must be dropped
BATCH_SIZE = 50
# The grace window outlasts a gap between two of the processor's batches on a loaded machine:
# a trace's agent spans reach the exporter in time to be shipped together.
GRACE_S = 1.0
PHASES = (
    Phase("trickle", 20, pause_s=0.1),
    Phase("flood", 150),
    Phase("flood, Redis killed after 30 of it", 300),
    Phase("trickle, Redis back", 30, pause_s=0.1),
)
KILL_AT = 20 + 150 + 30  # traces made when Redis is killed
FLOODS_END = 20 + 150 + 300
# Where a run can be lost in this test: the hand-off queue's bounds. Any other reason (a trace
# dropped whole, a late span, a shutdown) would break the per-run accounting and is a failure.
QUEUE_DROPS = {"queue_full", "queue_bytes"}


class Supervisor(threading.Thread):
    """Restarts a worker process that exited, under a new name (its own log), as systemd or
    Kubernetes would, and remembers each exit. The new worker reclaims the dead one's messages
    after the visibility timeout, as in production."""

    def __init__(self, url: str, tmp: Path, scores_path: Path, env: dict[str, str]) -> None:
        super().__init__(name="worker-supervisor", daemon=True)
        self.url, self.tmp, self.scores_path, self.env = url, tmp, scores_path, env
        self.workers: dict[WorkerProcess, str] = {}  # -> its pool
        self.exited: list[tuple[str, int | None]] = []
        self.halt = threading.Event()
        self._lock = threading.Lock()

    def add(self, name: str, pool: str) -> WorkerProcess:
        worker = WorkerProcess(
            name, self.url, self.tmp, scores_path=self.scores_path, env=self.env, pool=pool, concurrency=2
        )
        with self._lock:
            self.workers[worker] = pool
        return worker

    def run(self) -> None:
        while not self.halt.wait(0.2):
            with self._lock:
                dead = [(w, pool) for w, pool in self.workers.items() if w.proc.poll() is not None]
            for worker, pool in dead:
                if self.halt.is_set():
                    return
                self.exited.append((worker.name, worker.proc.returncode))
                with self._lock:
                    del self.workers[worker]
                worker.stop()  # closes its log
                self.add(f"{worker.name.split('~')[0]}~{len(self.exited)}", pool)

    def logs(self) -> str:
        with self._lock:
            workers = list(self.workers)
        return "\n".join(w.text()[-3000:] for w in workers)

    def stop(self) -> None:
        self.halt.set()
        self.join(10)
        with self._lock:
            workers = list(self.workers)
        for worker in workers:
            worker.stop()


WORKER_ENV = {
    "TSTEST_SLOW_S": "0.05",
    "TRACESCORE_TASK_SOFT_TIME_LIMIT": "12",
    "TRACESCORE_TASK_TIME_LIMIT": "15",
    # A dead worker's messages come back after this (the supervised test waits for them).
    "TRACESCORE_VISIBILITY_TIMEOUT": "20",
    "TRACESCORE_UNACKED_RESTORE_INTERVAL": "1",
}


def test_multi_run_requests_survive_a_flood_and_a_redis_restart(own_redis: RedisServer, tmp_path: Path) -> None:
    """The module's promises, on live multi-run traffic with Redis SIGKILLed mid-flood."""
    url = own_redis.url(0)
    scores_path = tmp_path / "scores.jsonl"
    supervisor = Supervisor(url, tmp_path, scores_path, WORKER_ENV)
    sink = AckedSink(CelerySink(url, connect_timeout_s=0.5, publish_timeout_s=0.5))
    exporter = ScoringSpanExporter(
        [ScoringRule(list(SCORERS))], sink, grace_s=GRACE_S, flush_interval_s=0.1, queue_size=QUEUE_SIZE,
        batch_size=BATCH_SIZE, retry_initial_s=0.05, retry_max_s=0.5,
    )  # fmt: skip
    app = MultiRunApp(exporter)
    traffic = Traffic(app, PHASES, checkpoint=KILL_AT)
    try:
        for name, pool in (("multi-threads", "threads"), ("multi-prefork", "prefork")):
            supervisor.add(name, pool).wait_ready()
        supervisor.start()
        logs = supervisor.logs

        traffic.start()
        # The trickle is scored while it trickles: the whole path works before any fault.
        assert wait_for(lambda: len(read_scores(scores_path)) >= 20, 60), f"{exporter.stats()}\n{logs()}"

        assert traffic.at_checkpoint.wait(120), exporter.stats()
        own_redis.stop()  # SIGKILL mid-flood: a publish or a worker's command under way loses its connection
        killed = time.monotonic()
        traffic.resume.set()
        # Down until the rest of the flood was handed to the sender (its grace window passed):
        # every one of those runs met a dead broker, more of them than the queue holds.
        assert wait_for(lambda: exporter.stats()["traces_completed"] >= FLOODS_END, 120), exporter.stats()
        assert wait_for(lambda: time.monotonic() - killed >= 1.0, 5)  # an outage, not a timing assertion
        outage = exporter.stats()
        own_redis.start()

        traffic.join(120)
        assert not traffic.is_alive()
        assert traffic.error is None, traffic.error
        made = app.runs
        assert app.traces == sum(p.traces for p in PHASES)

        def exporter_settled() -> bool:
            s = exporter.stats()
            return bool(
                s["spans_seen"] == app.spans
                and s["traces_buffered"] == 0
                and s["queue_depth"] == 0
                and not s["delayed"]
            )

        assert wait_for(exporter_settled, 120), exporter.stats()
        stats = exporter.stats()

        # --- the exporter: every run either acknowledged by Redis or counted under a reason ---
        acked = sink.acked()
        acked_runs = [(trace, target) for trace, targets in acked for target in targets]
        assert len(acked_runs) == len(set(acked_runs)), "the exporter sent a run twice"
        by_run = {(r.trace_id, r.span_id): r for r in made}
        assert set(acked_runs) <= set(by_run)
        assert (stats["skipped"], stats["errors"]) == ({}, {}), stats
        assert set(stats["dropped"]) <= QUEUE_DROPS, stats
        dropped = sum(stats["dropped"].values())
        assert stats["traces_completed"] == app.traces, stats
        assert stats["runs_found"] == len(made), stats
        assert stats["runs_sent"] == len(acked_runs), stats
        assert len(acked_runs) + dropped == len(made), (len(acked_runs), stats)
        # The outage's flood overflowed the queue (counted), and the sender got through again.
        assert outage["dropped"].get("queue_full", 0) > 0, outage
        assert outage["send_failures"] > 0, outage
        assert stats["runs_sent"] > outage["runs_sent"], (outage, stats)
        # Multi-run requests really were what travelled: most acknowledged runs shared a request.
        shared = sum(len(targets) for _, targets in acked if len(targets) > 1)
        assert shared > len(acked_runs) // 2, Counter(len(t) for _, t in acked)

        # --- the workers: each acknowledged run scored once per scorer, nothing else ---
        expected = {
            score_id_for(trace, span, scorer, "1"): (by_run[trace, span], scorer)
            for trace, span in acked_runs
            for scorer in SCORERS
        }
        # 120 s: a worker that died holds its messages until the visibility timeout (20 s).
        assert wait_for(lambda: len({s["score_id"] for s in read_scores(scores_path)}) >= len(expected), 120), (
            f"{len({s['score_id'] for s in read_scores(scores_path)})} of {len(expected)} scores\n{logs()}"
        )
        client = own_redis.client(0)
        try:
            # Settled: every message acknowledged (one whose ack died with the old connection
            # comes back after the visibility timeout and must add nothing).
            assert wait_for(lambda: client.hlen("unacked") == 0 and client.llen("tracescore") == 0, 120), logs()
            letters = [DeadLetter.model_validate_json(x) for x in client.lrange("tracescore:dlq", 0, -1)]
            assert letters == [], [(d.reason, d.run_ids) for d in letters]
        finally:
            client.close()

        scores = read_scores(scores_path)
        assert [s for s in scores if s["error_type"]] == []
        assert {s["score_id"] for s in scores} == set(expected)
        # Scored once: one record per score id. The JSONL sink is delivered at least once (a
        # re-send after a lost acknowledgement is the same record again, README "to the sinks"),
        # but a second scoring would be a second record (its own scored_at).
        records: dict[str, set[str]] = {}
        for s in scores:
            records.setdefault(s["score_id"], set()).add(repr(sorted(s.items())))
        twice = {i: len(r) for i, r in records.items() if len(r) > 1}
        assert twice == {}, f"{len(twice)} runs scored more than once"
        for s in scores:
            run, scorer = expected[s["score_id"]]
            got = (s["trace_id"], s["span_id"], s["span_name"], s["scorer_id"], round(s["score"], 6))
            assert got == (run.trace_id, run.span_id, run.span_name, scorer, run.length)
    finally:
        traffic.halt.set()
        traffic.resume.set()
        traffic.join(10)
        app.shutdown()
        supervisor.stop()


def test_workers_stay_up_through_redis_restarts_under_multi_run_traffic(own_redis: RedisServer, tmp_path: Path) -> None:
    """README: every Redis connection a worker holds reconnects after a Redis restart. Two
    workers (threads, prefork) score a steady trickle of multi-run traces from the real exporter;
    Redis is SIGKILLed and restarted up to ``cycles`` times (the exit is a race, so several
    restarts). No worker exits."""
    cycles = 8
    url = own_redis.url(0)
    scores_path = tmp_path / "scores.jsonl"
    sink = CelerySink(url, connect_timeout_s=0.5, publish_timeout_s=0.5)
    exporter = ScoringSpanExporter(
        [ScoringRule(list(SCORERS))], sink, grace_s=0.2, flush_interval_s=0.1, retry_initial_s=0.05, retry_max_s=0.5
    )
    app = MultiRunApp(exporter)
    # A flood, as in the test above: the workers are busy (messages delivered, not yet acked)
    # when Redis goes, which is when the consumer dies.
    traffic = Traffic(app, [Phase("flood", 1_000_000, pause_s=0.002)])
    workers: list[WorkerProcess] = []
    try:
        for name, pool in (("up-threads", "threads"), ("up-prefork", "prefork")):
            worker = WorkerProcess(
                name, url, tmp_path, scores_path=scores_path, env=WORKER_ENV, pool=pool, concurrency=2
            )
            workers.append(worker)
            worker.wait_ready()
        traffic.start()
        for _ in range(cycles):
            target = len(read_scores(scores_path)) + 100

            def flowing(t: int = target) -> bool:
                return len(read_scores(scores_path)) >= t

            # Messages are flowing (some delivered, unacked) when Redis goes.
            assert wait_for(flowing, 60), workers[0].text()[-3000:]
            own_redis.stop()
            time.sleep(0.5)  # an outage, not a timing assertion
            own_redis.start()
            # A consumer that died on the disconnect exits within a few seconds.
            if wait_for(lambda: any(w.proc.poll() is not None for w in workers), 3):
                break
        exited = {w.name: w.proc.returncode for w in workers if w.proc.poll() is not None}
        assert exited == {}, "\n".join(w.text()[-3000:] for w in workers)
    finally:
        traffic.halt.set()
        traffic.join(10)
        app.shutdown()
        for worker in workers:
            worker.stop()
