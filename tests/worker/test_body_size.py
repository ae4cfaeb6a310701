"""The guard marks a message it passed with its body's size, so the task need not serialize the
batch again to check the size cap (a message that skipped the guard is still measured)."""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace
from typing import Any

from tests.worker._batches import payload
from tracing.queue import SCORE_TASK_NAME
from worker._guard import BODY_BYTES_HEADER, check_message
from worker._settings import Settings
from worker._task import _screened

_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def _message(body: bytes, **headers: Any) -> SimpleNamespace:
    task_id = str(uuid.uuid4())
    return SimpleNamespace(
        headers={"task": SCORE_TASK_NAME, "id": task_id, "root_id": task_id, "retries": 0, **headers},
        body=body,
        content_type="application/json",
        content_encoding="utf-8",
    )


def test_a_passed_message_carries_its_measured_size_whatever_the_producer_claimed() -> None:
    batch = payload(range(2), ["s"])
    body = json.dumps([[batch], {}, _EMBED], ensure_ascii=False).encode()
    message = _message(body, **{BODY_BYTES_HEADER: 1})  # a producer's own figure never gets through
    refusal, decoded = check_message(message, Settings(), frozenset({SCORE_TASK_NAME}))
    assert refusal is None
    assert decoded[0][0] == batch
    assert message.headers[BODY_BYTES_HEADER] == len(body)


def test_a_refused_message_gets_no_size() -> None:
    message = _message(b"[not json")
    refusal, _ = check_message(message, Settings(), frozenset({SCORE_TASK_NAME}))
    assert refusal is not None
    assert refusal.reason == "not_json"
    assert BODY_BYTES_HEADER not in message.headers


def test_the_task_knows_a_screened_message_by_the_guards_header() -> None:
    screened = SimpleNamespace(request=SimpleNamespace(**{BODY_BYTES_HEADER: 12345}))
    assert _screened(screened)  # type: ignore[arg-type]
    direct = SimpleNamespace(request=SimpleNamespace())  # applied in process: no screen ran
    assert not _screened(direct)  # type: ignore[arg-type]
    for bad in (True, -5, "12", None):
        odd = SimpleNamespace(request=SimpleNamespace(**{BODY_BYTES_HEADER: bad}))
        assert not _screened(odd)  # type: ignore[arg-type]
