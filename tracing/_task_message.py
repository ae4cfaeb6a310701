"""The queue message for one ``ScoreBatch``: Celery's task protocol 2, JSON, built without Celery.

Producers (the exporter's ``CelerySink``, the backfill submitter) publish it with kombu so they
never import the worker. The body is encoded once by pydantic (``model_dump_json``), several
times cheaper than ``model_dump`` followed by kombu's own ``json.dumps``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from tracing._run import SCORE_TASK_NAME, ScoreBatch

__all__ = ["CONTENT_ENCODING", "CONTENT_TYPE", "TaskMessage", "task_message"]

CONTENT_TYPE = "application/json"
CONTENT_ENCODING = "utf-8"
_EMBED = '{"callbacks":null,"errbacks":null,"chain":null,"chord":null}'


@dataclass(frozen=True, slots=True)
class TaskMessage:
    task_id: str
    body: str
    headers: dict[str, Any]


def task_message(batch: ScoreBatch, origin: str) -> TaskMessage:
    """``SCORE_TASK_NAME`` with ``args=[batch]``: body ``[args, kwargs, embed]`` plus the headers
    a Celery worker reads (what ``send_task`` would produce)."""
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
        "argsrepr": f"(<ScoreBatch {batch.batch_id}: {len(batch.requests)} runs>,)",
        "kwargsrepr": "{}",
        "origin": origin,
        "ignore_result": True,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
    }
    body = "[[" + batch.model_dump_json() + "],{}," + _EMBED + "]"
    return TaskMessage(task_id, body, headers)
