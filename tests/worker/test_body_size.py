"""The guard measures a passed message's body once and the task reads that figure instead of
serializing the batch again (the task's own measure stays for messages that skip the guard)."""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace
from typing import Any

from tests.worker._batches import payload
from tracing.queue import SCORE_TASK_NAME
from worker._guard import BODY_BYTES_HEADER, check_message
from worker._settings import Settings
from worker._task import _size, _size_of

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


def test_the_task_reads_the_guards_figure_and_measures_itself_without_it() -> None:
    batch = payload(range(2), ["s"])
    screened = SimpleNamespace(request=SimpleNamespace(**{BODY_BYTES_HEADER: 12345}))
    assert _size_of(screened, batch) == 12345  # type: ignore[arg-type]
    direct = SimpleNamespace(request=SimpleNamespace())  # applied in process: no screen ran
    assert _size_of(direct, batch) == _size(batch) > 0  # type: ignore[arg-type]
    for bad in (True, -5, "12", None):
        odd = SimpleNamespace(request=SimpleNamespace(**{BODY_BYTES_HEADER: bad}))
        assert _size_of(odd, batch) == _size(batch)  # type: ignore[arg-type]
