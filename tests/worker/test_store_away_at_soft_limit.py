"""A batch's soft time limit passing while its score store (a Redis of its own) is away.

The README promises that a Redis outage never costs a message one of its tries: a store that
stays away is waited out and the message requeued (``StoreUnavailableError``). A batch whose runs
finished while the store was down waits for it to store their scores; if the soft time limit
passes first, the limit's ``TimeoutError`` (``SoftTimeLimitExceeded`` under prefork) was counted
as the batch's own failure: ``batch_retry`` with a try used, or on its last try a
``retry_budget_exhausted`` dead letter, although the scores were stored once the store was back.
A batch past its limit with the store up still uses its tries (no requeue without end).
"""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path

import pytest
from redis import exceptions as redis_errors

from tests._redis import RedisServer
from tests.worker._batches import batch, send
from tests.worker._workers import WorkerProcess, complete_lines, queue_and_unacked, read_scores, wait_for
from worker import _keys
from worker._settings import Settings
from worker._task import _store_unanswered

SOFT_S = 4.0
ENV = {
    # (tests.worker.shutdown_scorers' ``paced``: 0.1 s a word of the run's answer; run n has n % 30)
    "TSTEST_PACE_S": "0.1",
    "TRACESCORE_TASK_SOFT_TIME_LIMIT": str(SOFT_S),
    "TRACESCORE_TASK_TIME_LIMIT": "10",
    "TRACESCORE_VISIBILITY_TIMEOUT": "25",
    "TRACESCORE_RUN_TIMEOUT_SECONDS": "3",
    "TRACESCORE_UNACKED_RESTORE_INTERVAL": "1",
    "TRACESCORE_RETRY_BUDGET": "0",  # the last try: counted, the failure is a dead letter
}


def _letters(store: RedisServer) -> list[dict[str, object]]:
    with store.client(0) as client:
        return [json.loads(raw) for raw in client.lrange(_keys.dlq_key(), 0, -1)]


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_a_soft_limit_passing_while_the_store_is_away_costs_no_try(redis_url: str, tmp_path: Path, pool: str) -> None:
    scores, calls = tmp_path / "scores.jsonl", tmp_path / "calls.txt"
    with RedisServer(persistent=True) as store:
        worker = WorkerProcess(
            "soft-limit-store-away", redis_url, tmp_path, scores_path=scores, pool=pool,
            scorers="tests.worker.shutdown_scorers",
            env={**ENV, "TRACESCORE_REDIS_URL": store.url(0), "TSTEST_CALLS_FILE": str(calls)},
        )  # fmt: skip
        try:
            worker.wait_ready()
            sent = batch(range(10, 12), ["paced"], salt="soft-limit-store-away")  # runs of 1.0 and 1.1 s
            send(redis_url, sent)
            assert wait_for(lambda: any(x.startswith("start ") for x in complete_lines(calls)), 30), worker.text()
            store.stop()  # SIGKILL: the runs finish with nowhere to store their scores
            # Away past the soft limit (an outage, not a timing assertion), back within the
            # store clients' reconnect (15 s): what waited for it then goes on.
            time.sleep(SOFT_S + 1.5)
            assert worker.proc.poll() is None, worker.text()[-3000:]
            store.start()

            logs = lambda: worker.text()[-4000:]  # noqa: E731
            assert wait_for(lambda: len(read_scores(scores)) >= 2, 60), logs()
            assert wait_for(lambda: queue_and_unacked(redis_url, "tracescore") == (0, 0), 60), logs()
            said = worker.text()
            assert "batch_requeued" in said, logs()
            assert "store_away_at_time_limit" in said, logs()
            assert "message_dead_lettered" not in said, logs()
            assert _letters(store) == []
            # Each run scored once (the scorer's own count) and its score delivered once.
            done = collections.Counter(x.split()[1] for x in complete_lines(calls) if x.startswith("done "))
            assert sorted(done.values()) == [1, 1], done
            assert sorted(collections.Counter(s["score_id"] for s in read_scores(scores)).values()) == [1, 1]
            assert [s for s in read_scores(scores) if s["error_type"]] == []
            assert worker.proc.poll() is None, logs()
        finally:
            worker.stop()


def test_a_batch_past_its_soft_limit_with_the_store_up_still_uses_its_tries(redis_url: str, tmp_path: Path) -> None:
    """Three runs of 1.5-1.7 s one at a time: past the 4 s limit with nothing away. The try is
    counted (its last: a dead letter), not requeued as an outage would be, which would repeat
    without end."""
    scores, calls = tmp_path / "scores.jsonl", tmp_path / "calls.txt"
    with RedisServer() as store:
        worker = WorkerProcess(
            "soft-limit-store-up", redis_url, tmp_path, scores_path=scores,
            scorers="tests.worker.shutdown_scorers",
            env={
                **ENV, "TRACESCORE_REDIS_URL": store.url(0), "TSTEST_CALLS_FILE": str(calls),
                "TRACESCORE_RUN_CONCURRENCY": "1",
            },
        )  # fmt: skip
        try:
            worker.wait_ready()
            send(redis_url, batch(range(15, 18), ["paced"], salt="soft-limit-store-up"))
            assert wait_for(lambda: len(_letters(store)) == 1, 30), worker.text()[-4000:]
            [letter] = _letters(store)
            assert letter["reason"] == "retry_budget_exhausted", letter
            assert "store_away_at_time_limit" not in worker.text()
        finally:
            worker.stop()


@pytest.mark.parametrize("refusal", ["maxclients", "password_rotated"])
def test_a_store_that_answers_with_a_refusal_is_not_away(refusal: str) -> None:
    """The ping at the limit takes only silence for the store away (refused, reset, timed out):
    a store that answers a new connection with a refusal is there, and the batch it served
    through the worker's own connections used its try. redis-py raises both refusals below as
    a ``ConnectionError``: a store at its ``maxclients`` (the worker's pooled connections still
    served) or one whose password was rotated under the running worker (its connections stay
    signed in) was taken for away, and a batch merely slow came round without end, its runs
    judged again each time."""
    with RedisServer() as store:
        settings = Settings(broker_url="redis://127.0.0.1:1/0", redis_url=store.url(0))
        with store.client(0) as held:
            if refusal == "maxclients":
                held.config_set("maxclients", "1")  # this connection is the one
            else:
                held.config_set("requirepass", "rotated")
            away = _store_unanswered(settings)
            assert away is None, type(away).__name__
        store.stop()
        away = _store_unanswered(settings)
        assert isinstance(away, redis_errors.ConnectionError), type(away).__name__  # silence: away
