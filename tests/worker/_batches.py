"""Building ScoreBatch messages for the worker tests and the benchmark."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from tracing._run import RunIdentity, ScoreBatch, ScoreRequest, TracedRun


def trace_id(n: int, salt: str = "") -> str:
    return hashlib.md5(f"trace-{salt}-{n}".encode()).hexdigest()


def span_id(n: int, salt: str = "") -> str:
    return hashlib.md5(f"span-{salt}-{n}".encode()).hexdigest()[:16]


def request(n: int, scorer_ids: list[str], *, salt: str = "", job_id: str | None = None) -> ScoreRequest:
    run = TracedRun.model_validate(
        {
            "identity": RunIdentity(trace_id=trace_id(n, salt), span_id=span_id(n, salt), span_name="agent.run"),
            "input": {"input_messages": [{"role": "user", "content": f"question {n}"}]},
            "output": [{"role": "assistant", "content": "answer " * (n % 30)}],
        }
    )
    return ScoreRequest(
        run=run,
        scorer_ids=scorer_ids,
        source="backfill" if job_id else "live",
        job_id=job_id,
        enqueued_at=time.time(),
    )


def batch(
    runs: range, scorer_ids: list[str], *, salt: str = "", job_id: str | None = None, batch_id: str = ""
) -> ScoreBatch:
    return ScoreBatch(
        batch_id=batch_id or f"b-{salt}-{runs.start}-{runs.stop}",
        requests=[request(n, scorer_ids, salt=salt, job_id=job_id) for n in runs],
    )


def payload(runs: range, scorer_ids: list[str], **kwargs: Any) -> dict[str, Any]:
    return batch(runs, scorer_ids, **kwargs).model_dump(mode="json")
