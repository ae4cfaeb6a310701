"""Building ScoreBatch messages for the worker tests and the benchmark: one GenAI agent span per
run, shipped as span records (the one request shape); the worker reads the run from it."""

from __future__ import annotations

import base64
import hashlib
import json
import time
import uuid
from typing import Any

from tracing import CelerySink, SpanRecord
from tracing.queue import ScoreBatch, ScoreRequest

# Where a run's answer text sits in its request's JSON: requests[i]["spans"][0]["attributes"][OUTPUT].
OUTPUT = "gen_ai.output.messages"


def trace_id(n: int, salt: str = "") -> str:
    return hashlib.md5(f"trace-{salt}-{n}".encode()).hexdigest()


def span_id(n: int, salt: str = "") -> str:
    return hashlib.md5(f"span-{salt}-{n}".encode()).hexdigest()[:16]


def output_messages(text: str) -> str:
    """The ``gen_ai.output.messages`` value of an assistant answer ``text``."""
    return json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": text}]}])


def request(n: int, scorer_ids: list[str], *, salt: str = "", job_id: str | None = None) -> ScoreRequest:
    span = SpanRecord(
        trace_id=trace_id(n, salt),
        span_id=span_id(n, salt),
        name="agent.run",
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.input.messages": json.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": f"question {n}"}]}]
            ),
            OUTPUT: output_messages("answer " * (n % 30)),
        },
    )
    return ScoreRequest(
        spans=[span],
        target_span_ids=[span.span_id],
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


def mixed_batch(bad: str, salt: str) -> ScoreBatch:
    """One message: run 0 scored by ``bad``, runs 1-3 by ``length`` (a faulty run beside good ones)."""
    good = batch(range(1, 4), ["length"], salt=salt)
    odd = batch(range(1), [bad], salt=salt)
    return good.model_copy(update={"batch_id": f"mixed-{salt}", "requests": odd.requests + good.requests})


def payload(runs: range, scorer_ids: list[str], **kwargs: Any) -> dict[str, Any]:
    return batch(runs, scorer_ids, **kwargs).model_dump(mode="json")


def send(redis_url: str, *batches: ScoreBatch) -> None:
    """Publish ``batches`` to the workers' queue on ``redis_url``, as an app's exporter does."""
    sink = CelerySink(redis_url)
    try:
        for b in batches:
            sink.send(b)
    finally:
        sink.close()


def kombu_entry(
    body: bytes,
    headers: dict[str, Any],
    task_id: str,
    *,
    tag: str | None = None,
    queue: str = "tracescore",
    body_encoding: Any = "base64",
    content_type: str = "application/json",
    content_encoding: str = "utf-8",
) -> dict[str, Any]:
    """The Redis list entry kombu's Redis transport writes for a message (``json.dumps`` it and
    push it on ``queue``); a ``body_encoding`` other than base64 leaves the body as its bytes."""
    return {
        "body": base64.b64encode(body).decode() if body_encoding == "base64" else body.decode("latin-1"),
        "content-encoding": content_encoding,
        "content-type": content_type,
        "headers": headers,
        "properties": {
            "correlation_id": task_id,
            "reply_to": None,
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "body_encoding": body_encoding,
            "delivery_tag": tag or str(uuid.uuid4()),
        },
    }


def seed_due_unacked(client: Any, messages: int, queue: str, *, prefix: str = "due") -> list[str]:
    """What a mass outage leaves: ``messages`` records in kombu's unacked hash and its index, each
    taken a day ago (due for the sweep under any visibility timeout), to be put back on ``queue``
    (kombu's default exchange: no binding needed). Written in one transaction, so a sweep finds
    all or none of them. Returns their delivery tags."""
    tags = [f"{prefix}-{n}" for n in range(messages)]
    taken_at = time.time() - 86400
    pipe = client.pipeline(transaction=True)
    for n, tag in enumerate(tags):
        entry = kombu_entry(b'{"n": %d}' % n, {"id": tag}, tag, tag=tag, queue=queue)
        pipe.hset("unacked", tag, json.dumps([entry, "", queue]))
        pipe.zadd("unacked_index", {tag: taken_at + n * 1e-3})
    pipe.execute()
    return tags
