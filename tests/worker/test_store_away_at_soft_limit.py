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

from tests._redis import RedisServer
from tests.worker._batches import batch, send
from tests.worker._workers import WorkerProcess, complete_lines, queue_and_unacked, read_scores, wait_for
from worker import _keys

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
