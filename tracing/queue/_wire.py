"""The wire format of one ``ScoreBatch``: Celery's task protocol 2, JSON, built without Celery.

The publisher (``tracing.queue.Publisher``, for the exporter and backfill alike) sends it with
kombu, so producers never import the worker; the worker's guard (``worker/_guard.py``) screens
this exact shape, parsed by ``parse_json``, before Celery decodes it. The body is encoded once:
each request by ``request_json`` (orjson, the text pydantic would write), spliced into the batch's
shell, several times cheaper than ``model_dump`` followed by kombu's own ``json.dumps``. A
producer that already encoded each request (to size its messages under the workers' cap) passes
that JSON in ``requests_json`` and nothing is serialized twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tracing.queue._contract import PLAIN_ID_RULE, SCORE_TASK_NAME, ScoreBatch, plain_id, request_json
from tracing.queue._json import loads as parse_json

__all__ = [
    "CONTENT_ENCODING",
    "CONTENT_TYPE",
    "TaskMessage",
    "parse_json",
    "task_message",
    "wire_size",
]

CONTENT_TYPE = "application/json"
CONTENT_ENCODING = "utf-8"
_EMBED = '{"callbacks":null,"errbacks":null,"chain":null,"chord":null}'


@dataclass(frozen=True, slots=True)
class TaskMessage:
    task_id: str
    body: str
    headers: dict[str, Any]


def wire_size(encoded: str) -> int:
    """An upper bound of the size of JSON text ``encoded`` however a worker measures it: its
    UTF-8 bytes, or ``json.dumps`` with ASCII escapes (a non-ASCII character of k UTF-8 bytes
    becomes a 6- or 12-character escape, at most 5 more per extra byte)."""
    length = len(encoded)
    if encoded.isascii():
        return length
    return length + 5 * (len(encoded.encode("utf-8", "surrogatepass")) - length)


def task_message(batch: ScoreBatch, origin: str, requests_json: Sequence[str] | None = None) -> TaskMessage:
    """``SCORE_TASK_NAME`` with ``args=[batch]``: body ``[args, kwargs, embed]`` plus the headers
    a Celery worker reads (what ``send_task`` would produce). ``requests_json``, when given, is
    ``request_json`` of each of ``batch.requests`` in order, spliced in as is."""
    if not plain_id(batch.batch_id):
        # (the workers refuse it, not retryable: said here, to the producer, not in their letter)
        raise ValueError(f"a batch id must be a plain id: {PLAIN_ID_RULE} (see plain_id)")
    task_id = str(uuid.uuid4())
    headers: dict[str, Any] = {
        "lang": "py",
        "task": SCORE_TASK_NAME,
        "id": task_id,
        "root_id": task_id,
        "parent_id": None,
        "group": None,
        "group_index": None,
        "shadow": None,
        "eta": None,
        "expires": None,
        "retries": 0,
        "timelimit": [None, None],
        "argsrepr": f"(<ScoreBatch {batch.batch_id}: {batch.runs()} runs>,)",
        "kwargsrepr": "{}",
        "origin": origin,
        "ignore_result": True,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
    }
    if requests_json is None:
        requests_json = [request_json(request) for request in batch.requests]
    elif len(requests_json) != len(batch.requests):
        raise ValueError(f"requests_json has {len(requests_json)} entries for {len(batch.requests)} requests")
    # The batch without its requests, {"batch_id":"...","requests":[]}, is pydantic's own
    # encoding (escaping, field order); the requests go between its last two characters.
    shell = ScoreBatch.model_construct(batch_id=batch.batch_id, requests=[]).model_dump_json()
    if not shell.endswith("[]}"):
        raise AssertionError("ScoreBatch no longer ends with its requests; update task_message")
    batch_json = shell[:-2] + ",".join(requests_json) + "]}"
    body = "[[" + batch_json + "],{}," + _EMBED + "]"
    return TaskMessage(task_id, body, headers)
