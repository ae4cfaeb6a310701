"""Delivery to sinks with real Redis, real worker processes and a real OTLP/HTTP receiver:
a sink down and back, a refusal, and a worker SIGKILLed before its sinks had the scores."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests._otlp_receiver import OtlpReceiver
from tests._redis import RedisServer, free_port
from tests.worker._batches import batch
from tests.worker._workers import ROOT, WorkerProcess, read_scores, wait_for
from tracing import CelerySink, ScoreRecord
from tracing.queue import ScoreBatch
from worker.store import RedisOutbox

START, END = 1_764_000_000_000_000_000, 1_764_000_001_000_000_000
TRACESCORE = str(Path(sys.executable).with_name("tracescore"))


def _env(endpoint: str, **extra: str) -> dict[str, str]:
    return {
        "TRACESCORE_SINKS": "otlp,jsonl",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2",
        "TRACESCORE_SINK_BACKOFF_SECONDS": "0.2",
        "TRACESCORE_SINK_BACKOFF_MAX_SECONDS": "0.5",
        "TRACESCORE_SINK_LEASE_SECONDS": "3",
        "TRACESCORE_SINK_MAX_ATTEMPTS": "1000",
        **extra,
    }


class Started:
    """Worker processes and receivers of one test, always stopped."""

    def __init__(self, redis_url: str, tmp: Path) -> None:
        self.redis_url, self.tmp = redis_url, tmp
        self.scores = tmp / "scores.jsonl"
        self.workers: list[WorkerProcess] = []
        self.receivers: list[OtlpReceiver] = []

    def worker(self, name: str, env: dict[str, str]) -> WorkerProcess:
        worker = WorkerProcess(name, self.redis_url, self.tmp, scores_path=self.scores, env=env)
        self.workers.append(worker)
        worker.wait_ready()
        return worker

    def receiver(self, port: int | None = None) -> OtlpReceiver:
        receiver = OtlpReceiver(port).start()
        self.receivers.append(receiver)
        return receiver

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        for receiver in self.receivers:
            receiver.stop()


@pytest.fixture
def started(redis_url: str, tmp_path: Path) -> Iterator[Started]:
    s = Started(redis_url, tmp_path)
    try:
        yield s
    finally:
        s.stop()


def _send(redis_url: str, n: int, salt: str) -> tuple[ScoreBatch, set[str]]:
    """A batch of ``n`` runs scored by ``length``, its spans timed START..END; returns the score ids."""
    msg = batch(range(n), ["length"], salt=salt)
    for request in msg.requests:
        for span in request.spans:
            span.start_time_ns, span.end_time_ns = START, END
    sink = CelerySink(redis_url)
    sink.send(msg)
    sink.close()
    from tests.worker.sample_scorers import length
    from tracing import score_id_for

    return msg, {score_id_for(r.trace_id, t, "length", length.version) for r in msg.requests for t in r.target_span_ids}


def _stored(redis_url: str) -> int:
    client = redis.Redis.from_url(redis_url)
    try:
        return sum(1 for _ in client.scan_iter("tracescore:score:*"))
    finally:
        client.close()


def _counts(redis_url: str) -> dict[str, Any]:
    outbox = RedisOutbox(redis_url)
    try:
        return {name: c.as_dict() for name, c in outbox.counts().items()}
    finally:
        outbox.close()


def _cli(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRACESCORE_BROKER_URL": redis_url, "PYTHONPATH": str(ROOT)}
    return subprocess.run([TRACESCORE, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)


def test_a_sink_down_then_back_gets_every_score_once_and_never_delays_another(started: Started, redis_url: str) -> None:
    """OTLP answers 503 while the JSONL sink takes every score at once; once OTLP is back, every
    score arrives there exactly once (counted by score id at the receiver), inside its span."""
    receiver = started.receiver()
    receiver.status = 503
    worker = started.worker("down", _env(receiver.endpoint))
    _, ids = _send(redis_url, 12, "down")
    assert wait_for(lambda: {s["score_id"] for s in read_scores(started.scores)} == ids, 60), worker.text()[-3000:]
    assert receiver.score_ids() == {}
    assert wait_for(lambda: receiver.requests >= 2, 30)  # it did try, and keeps trying
    # Two requests can both be first tries (the scores were stored in two batches); a retry is
    # counted only once the worker has read the 503, so wait for the count itself.
    assert wait_for(lambda: _counts(redis_url)["otlp"]["retried"] >= 1, 30)
    counts = _counts(redis_url)
    assert counts["jsonl"]["delivered"] == 12
    assert counts["otlp"]["pending"] == 12

    receiver.status = 200
    assert wait_for(lambda: set(receiver.score_ids()) == ids, 60), worker.text()[-3000:]
    assert wait_for(lambda: _counts(redis_url)["otlp"]["pending"] == 0, 30)
    assert max(receiver.score_ids().values()) == 1
    assert _counts(redis_url)["otlp"]["delivered"] == 12
    assert all(START <= span.start_time_unix_nano <= span.end_time_unix_nano <= END for span in receiver.spans)
    # Nothing of a score's content in the worker's log lines about delivery.
    assert "reason=" not in "\n".join(line for line in worker.text().splitlines() if "sink_" in line)


def test_a_refusal_is_a_dead_letter_with_the_backends_answer_and_can_be_retried(
    started: Started, redis_url: str
) -> None:
    """A 400 from the endpoint: each score becomes the OTLP sink's dead letter carrying the
    endpoint's answer, counted in `tracescore status`; `tracescore sinks retry otlp --all` once
    the endpoint accepts delivers them."""
    receiver = started.receiver()
    receiver.status, receiver.answer = 400, b"missing header x-mlflow-experiment-id"
    worker = started.worker("refused", _env(receiver.endpoint))
    _, ids = _send(redis_url, 5, "refused")
    assert wait_for(lambda: _counts(redis_url).get("otlp", {}).get("failed") == 5, 60), worker.text()[-3000:]

    listed = _cli(redis_url, "sinks", "list", "otlp", "--json")
    assert listed.returncode == 0, listed.stderr
    letters = json.loads(listed.stdout)["otlp"]["dead_letters"]
    assert {x["score_id"] for x in letters} == ids
    assert {(x["reason"], x["detail"]) for x in letters} == {("otlp_http_400", "missing header x-mlflow-experiment-id")}
    status = _cli(redis_url, "status", "--json")
    sinks = json.loads(status.stdout)["sinks"]
    assert sinks["otlp"]["failed"] == 5
    assert sinks["jsonl"]["delivered"] == 5
    assert "otlp: 0 delivered, 0 pending, 5 failed" in _cli(redis_url, "status").stdout

    receiver.status = 200
    retried = _cli(redis_url, "sinks", "retry", "otlp", "--all")
    assert retried.returncode == 0, retried.stderr
    assert "5 score(s) queued again" in retried.stdout
    assert wait_for(lambda: set(receiver.score_ids()) == ids, 60), worker.text()[-3000:]
    assert max(receiver.score_ids().values()) == 1
    assert _counts(redis_url)["otlp"]["failed"] == 0


def test_a_sink_refusing_every_score_keeps_its_newest_dead_letters_up_to_the_bound(
    started: Started, redis_url: str
) -> None:
    """A backend that refuses every score (a deleted project, a revoked key) made one dead letter
    per score for good: the records expire, the letters never did, and Redis filled until it
    refused every write. With TRACESCORE_SINK_MAX_DEAD_LETTERS=3 a worker keeps the newest 3, counts
    the rest as dropped past the bound (`status`), logs that a line a minute without content, and
    `sinks drop otlp --all --yes` removes the kept ones."""
    receiver = started.receiver()
    receiver.status, receiver.answer = 400, b"project deleted"
    worker = started.worker("bounded", _env(receiver.endpoint, TRACESCORE_SINK_MAX_DEAD_LETTERS="3"))
    _send(redis_url, 8, "bounded")
    done = lambda: _counts(redis_url).get("otlp", {}).get("dead_letters_dropped") == 5  # noqa: E731
    assert wait_for(done, 60), (_counts(redis_url), worker.text()[-3000:])
    counts = _counts(redis_url)["otlp"]
    assert (counts["failed"], counts["pending"]) == (3, 0)
    assert counts["dead_letters_dropped"] == 5
    assert _counts(redis_url)["jsonl"]["delivered"] == 8
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.hlen("tracescore:outbox:otlp:dead") == 3
    finally:
        client.close()
    status = json.loads(_cli(redis_url, "status", "--json").stdout)
    assert status["sinks"]["otlp"]["dead_letters_dropped"] == 5
    assert wait_for(lambda: "sink_dead_letters_dropped_past_bound" in worker.text(), 10)
    log = worker.text()
    assert log.count("sink_dead_letters_dropped_past_bound") == 1  # a line a minute, not one a letter
    assert "project deleted" not in "\n".join(x for x in log.splitlines() if "past_bound" in x)

    dropped = _cli(redis_url, "sinks", "drop", "otlp", "--all", "--yes")
    assert dropped.returncode == 0, dropped.stderr
    assert "3 dropped, 0 not" in dropped.stderr
    counts = _counts(redis_url)["otlp"]
    assert (counts["failed"], counts["dead_letters_dropped"]) == (0, 5)


def test_worker_killed_after_storing_before_its_sinks_had_the_scores(started: Started, redis_url: str) -> None:
    """THE crash test: scores stored, the OTLP endpoint not listening, the worker SIGKILLed; a new
    worker delivers every stored score to every sink: OTLP gets each exactly once."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/v1/traces"
    first = started.worker("crash-a", _env(endpoint))
    _, ids = _send(redis_url, 10, "crash")
    assert wait_for(lambda: _stored(redis_url) == 10, 60), first.text()[-3000:]
    assert wait_for(lambda: _counts(redis_url).get("otlp", {}).get("retried", 0) >= 1, 30), first.text()[-3000:]
    first.kill()
    assert _counts(redis_url)["otlp"]["pending"] == 10  # stored, owed, not delivered

    receiver = started.receiver(port)
    second = started.worker("crash-b", _env(endpoint))
    assert wait_for(lambda: set(receiver.score_ids()) == ids, 60), second.text()[-3000:]
    assert wait_for(lambda: {s["score_id"] for s in read_scores(started.scores)} == ids, 30)
    assert wait_for(lambda: _counts(redis_url)["otlp"]["pending"] == 0, 30)
    assert max(receiver.score_ids().values()) == 1
    records = [ScoreRecord.model_validate(s) for s in read_scores(started.scores)]
    assert {r.score_id for r in records} == ids


def test_a_hung_sink_does_not_hold_up_another(started: Started, redis_url: str) -> None:
    """The OTLP endpoint takes requests and never answers: the JSONL sink still gets every score
    (well inside the OTLP timeout); once the endpoint answers again, OTLP gets each score once."""
    receiver = started.receiver()
    receiver.hang.clear()
    worker = started.worker("hung", _env(receiver.endpoint, OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="30"))
    _, ids = _send(redis_url, 8, "hung")
    assert wait_for(lambda: receiver.requests >= 1, 30), worker.text()[-3000:]
    assert wait_for(lambda: {s["score_id"] for s in read_scores(started.scores)} == ids, 15), worker.text()[-3000:]
    assert receiver.score_ids() == {}
    receiver.hang.set()
    assert wait_for(lambda: set(receiver.score_ids()) == ids, 60), worker.text()[-3000:]
    assert max(receiver.score_ids().values()) == 1


def test_a_redis_paused_under_the_drainers_loses_and_wedges_nothing(private_redis: RedisServer, tmp_path: Path) -> None:
    """Scores owed to an OTLP endpoint that refuses them (503), then the worker's Redis stopped
    (SIGSTOP: connections open, no answer) for longer than a command may wait, while the endpoint
    comes back. A drainer's calls time out meanwhile; none is sent again after its wait (each
    would have waited as long again), and the drainer neither dies nor wedges: once Redis
    answers again every score reaches the endpoint, the outbox settles, and the worker goes on
    delivering new scores."""
    url = private_redis.url(0)
    started = Started(url, tmp_path)
    try:
        receiver = started.receiver()
        receiver.status = 503
        worker = started.worker("paused", _env(receiver.endpoint))
        _, ids = _send(url, 10, "paused-a")
        assert wait_for(lambda: _counts(url).get("otlp", {}).get("retried", 0) >= 1, 60), worker.text()[-3000:]
        assert private_redis.proc is not None
        private_redis.proc.send_signal(signal.SIGSTOP)
        try:
            receiver.status = 200
            paused_until = time.monotonic() + 14  # past a command's 10 s wait, and the 3 s lease
            while time.monotonic() < paused_until:
                time.sleep(0.2)
            assert worker.proc.poll() is None
        finally:
            private_redis.proc.send_signal(signal.SIGCONT)
        assert wait_for(lambda: set(receiver.score_ids()) == ids, 60), worker.text()[-3000:]
        assert wait_for(lambda: _counts(url)["otlp"]["pending"] == 0, 30), worker.text()[-3000:]
        assert _counts(url)["otlp"]["delivered"] == 10  # each counted once, whatever was sent twice
        _, later = _send(url, 4, "paused-b")
        assert wait_for(lambda: later <= set(receiver.score_ids()), 30), worker.text()[-3000:]
        log = worker.text()
        assert "Traceback" not in log
        # (the pause was met: the drainer's call timed out, and the drainer went on)
        assert any("drainer_failed" in line and "error_type=TimeoutError" in line for line in log.splitlines())
    finally:
        started.stop()
