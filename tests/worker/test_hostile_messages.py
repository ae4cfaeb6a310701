"""Hostile and broken queue messages, written straight into the Redis list in kombu's wire
format, against real ``celery -A worker worker`` processes: each is refused, becomes exactly
one dead letter with a named reason, is counted by ``tracescore status``, never reaches the
worker's log, and the worker goes on scoring."""

from __future__ import annotations

import base64
import collections
import datetime as dt
import hashlib
import json
import re
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from tests.worker._batches import OUTPUT, kombu_entry, output_messages, payload
from tests.worker._workers import WorkerProcess, read_scores, wait_for
from tracing.queue import PLAIN_ID_PATTERN, SCORE_TASK_NAME, plain_id
from worker._guard import Refusal, check_message, screen_envelope
from worker._settings import get_settings
from worker._task import MAX_DEAD_PAYLOAD_BYTES
from worker.store import DeadLetter

MARKER = "AGENT-CONTENT-MARKER-51d2"
QUEUE = "tracescore"
MAX_PAYLOAD = 512 * 1024  # above the 100k-deep body (200 KB), so that one is refused for its depth
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
# The task's count of a message's waits for the store (not tries of the message), on the message.
STORE_WAITS = "tracescore_store_waits"


def envelope(
    body: bytes | str,
    *,
    task: Any = SCORE_TASK_NAME,
    content_type: str = "application/json",
    content_encoding: str = "utf-8",
    body_encoding: Any = "base64",
    headers: dict[str, Any] | None = None,
    drop_headers: tuple[str, ...] = (),
    tag: str | None = None,
) -> tuple[str, bytes]:
    """One Redis list entry as kombu writes it; returns (delivery tag, entry)."""
    task_id = str(uuid.uuid4())
    tag = tag or str(uuid.uuid4())
    head: dict[str, Any] = {
        "lang": "py",
        "task": task,
        "id": task_id,
        "root_id": task_id,
        "parent_id": None,
        "group": None,
        "shadow": None,
        "eta": None,
        "expires": None,
        "retries": 0,
        "timelimit": [None, None],
        "argsrepr": f"({MARKER},)",
        "kwargsrepr": "{}",
        "origin": "test",
        **(headers or {}),
    }
    for name in drop_headers:
        head.pop(name, None)
    raw = body.encode() if isinstance(body, str) else body
    entry = kombu_entry(
        raw,
        head,
        task_id,
        tag=tag,
        queue=QUEUE,
        body_encoding=body_encoding,
        content_type=content_type,
        content_encoding=content_encoding,
    )
    return tag, json.dumps(entry).encode()


def task_body(args: list[Any], kwargs: dict[str, Any] | None = None, embed: dict[str, Any] | None = None) -> str:
    return json.dumps([args, kwargs or {}, embed or _EMBED])


def secret_batch(salt: str) -> dict[str, Any]:
    """A valid ScoreBatch whose agent content carries the marker."""
    p = payload(range(1), ["length"], salt=salt)
    p["requests"][0]["spans"][0]["attributes"][OUTPUT] = output_messages(f"the answer is {MARKER}")
    return p


def hostile_messages() -> list[tuple[str, str, bytes]]:
    """(expected reason, message key, entry) for every kind of bad message."""
    good = secret_batch("hostile")
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(days=30)).isoformat()
    deep = "[" * 100_000 + "]" * 100_000
    nested: Any = MARKER
    for _ in range(150):
        nested = {"x": nested}
    deep_args = dict(good, requests=[{**good["requests"][0], "ground_truth": nested}])
    cases: list[tuple[str, str | None, bytes]] = []

    def add(reason: str, built: tuple[str, bytes]) -> None:
        cases.append((reason, built[0], built[1]))

    def raw(reason: str, entry: bytes) -> None:
        cases.append((reason, None, entry))

    # The Redis entry itself (kombu's envelope) is broken.
    raw("not_json", f"not an envelope {MARKER}".encode())
    raw("bad_envelope", json.dumps({"body": MARKER, "headers": {}}).encode())
    raw("payload_too_large", b"x" * (MAX_PAYLOAD * 3) + MARKER.encode())  # oversized and not JSON
    add("bad_encoding", envelope(task_body([good]), body_encoding="rot13"))
    add("bad_encoding", _not_base64())
    # kombu reads it as int() when it puts the message back (a requeue, the visibility restore):
    # an infinity there failed the restore, which then logged the whole message and dropped it.
    add("bad_encoding", _with_priority(float("inf")))
    add("bad_encoding", _with_priority(MARKER))
    deep_header: Any = MARKER
    for _ in range(900):
        deep_header = [deep_header]
    add("too_deep", envelope(task_body([good]), headers={"x-deep": deep_header}))
    bomb = zlib.compress(b"[" * 50_000_000)  # 50 MB of brackets in about 50 KB
    add("compression_refused", envelope(bomb, headers={"compression": "application/x-gzip"}))
    # The body.
    add("not_json", envelope(f"not json {MARKER}"))
    add("bad_body", envelope(json.dumps(MARKER)))
    add("bad_body", envelope(json.dumps({"args": [MARKER]})))
    add("bad_encoding", envelope(task_body([good]).encode("utf-16"), content_encoding="utf-16"))
    add("bad_encoding", envelope(b'[["\xff\xfe' + MARKER.encode() + b'"],{},{}]'))
    add("too_deep", envelope(deep))
    add("too_deep", envelope(task_body([deep_args])))
    add("payload_too_large", envelope(f"not json, just big {MARKER} " + "y" * MAX_PAYLOAD))
    # Arguments.
    add("bad_arguments", envelope(task_body([good, 1])))
    add("bad_arguments", envelope(task_body([good], {"payload": MARKER})))
    add("bad_arguments", envelope(task_body([])))
    add("bad_arguments", envelope(task_body([MARKER])))
    # Serializers other than JSON.
    pickled = b"\x80\x04\x95" + MARKER.encode()
    add("content_type_refused", envelope(pickled, content_type="application/x-python-serialize",
                                         content_encoding="binary"))  # fmt: skip
    add("content_type_refused", envelope(f"!!python/object/apply:os.system ['echo {MARKER}']",
                                         content_type="application/x-yaml"))  # fmt: skip
    add("content_type_refused", envelope(b"\x93\x91\xa4" + MARKER.encode(), content_type="application/x-msgpack",
                                         content_encoding="binary"))  # fmt: skip
    # Tasks that are not ours, and what would run more than our task.
    add("unknown_task", envelope(task_body([MARKER]), task="celery.backend_cleanup"))
    add("unknown_task", envelope(task_body([MARKER]), task="celery.chord_unlock"))
    add("unknown_task", envelope(task_body([MARKER]), task="evil.not_ours"))
    add("unknown_task", envelope(task_body([good]), task=[SCORE_TASK_NAME, MARKER]))
    add("unknown_task", envelope(task_body([good]), task={"name": SCORE_TASK_NAME}))
    add("not_a_task", envelope(json.dumps({"task": SCORE_TASK_NAME, "args": [good]}), drop_headers=("task",)))
    callback = {"task": "celery.backend_cleanup", "args": [], "kwargs": {}, "options": {}, "subtask_type": None}
    add("callbacks_refused", envelope(task_body([good], embed={**_EMBED, "callbacks": [callback]})))
    add("callbacks_refused", envelope(task_body([good], embed={**_EMBED, "chain": [callback]})))
    # Celery would copy these onto the task's request, past the screened headers.
    add("bad_body", envelope(task_body([good], embed={**_EMBED, "retries": 5000, "tracescore_body_bytes": 7})))
    add("eta_too_far", envelope(task_body([good]), headers={"eta": soon}))
    add("bad_headers", envelope(task_body([good]), headers={"eta": f"tomorrow {MARKER}"}))
    add("bad_headers", envelope(task_body([good]), headers={"timelimit": [10**9, 10**9]}))
    add("bad_headers", envelope(task_body([good]), headers={"retries": "many"}))
    # The task's count of the retries that waited for the store (not tries): a retries header
    # of more tries than any budget, or waits it does not hold, is a producer's.
    add("bad_headers", envelope(task_body([good]), headers={"retries": 5000}))
    add("bad_headers", envelope(task_body([good]), headers={"retries": 5000, STORE_WAITS: 3000}))
    add("bad_headers", envelope(task_body([good]), headers={"retries": 2, STORE_WAITS: 3}))
    add("bad_headers", envelope(task_body([good]), headers={"retries": 2, STORE_WAITS: "2"}))
    add("bad_headers", envelope(task_body([good]), headers={"expires": "2000-01-01T00:00:00+00:00"}))
    # The header the workers' own screen marks a stand-in with, set by a producer: its reason
    # would be a dead-letter reason (a metric label) of the producer's choosing.
    forged = {"x-tracescore-refused": "made_up_reason_1", "x-tracescore-refused-detail": MARKER}
    add("bad_headers", envelope(task_body([good]), headers=forged))
    add("bad_headers", envelope(task_body([good]), headers={"x-tracescore-refused": ["not", "a", "reason"]}))
    return [(reason, f"msg:{tag or hashlib.sha256(entry).hexdigest()}", entry) for reason, tag, entry in cases]


def _not_base64() -> tuple[str, bytes]:
    """A base64 body that is not base64 (kombu would raise while building the message)."""
    tag, entry = envelope(task_body([MARKER]))
    data = json.loads(entry)
    data["body"] = "%%% not base64 %%% " + MARKER
    return tag, json.dumps(data).encode()


def _with_priority(priority: Any) -> tuple[str, bytes]:
    """A valid task message whose ``properties.priority`` is ``priority``."""
    tag, entry = envelope(task_body([secret_batch("priority")]))
    data = json.loads(entry)
    data["properties"]["priority"] = priority
    return tag, json.dumps(data).encode()  # an infinity is written as JSON's Infinity, which json.loads reads


def _dlq(redis_url: str) -> list[DeadLetter]:
    client = redis.Redis.from_url(redis_url)
    try:
        return [DeadLetter.model_validate_json(raw) for raw in client.lrange("tracescore:dlq", 0, -1)]
    finally:
        client.close()


@pytest.fixture
def worker(redis_url: str, tmp_path: Path) -> Iterator[WorkerProcess]:
    proc = WorkerProcess(
        "hostile",
        redis_url,
        tmp_path,
        scores_path=tmp_path / "scores.jsonl",
        env={"TRACESCORE_MAX_PAYLOAD_BYTES": str(MAX_PAYLOAD)},
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _status(redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    from worker.cli import main

    monkeypatch.setenv("TRACESCORE_BROKER_URL", redis_url)
    get_settings.cache_clear()
    try:
        capsys.readouterr()
        assert main(["status", "--json", "--timeout", "0.5"]) == 0
        status: dict[str, Any] = json.loads(capsys.readouterr().out)
        return status
    finally:
        get_settings.cache_clear()


def test_hostile_messages_are_each_one_dead_letter_and_the_worker_keeps_scoring(
    worker: WorkerProcess,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Not-JSON (envelope and body), string bodies, wrong encodings, wrong arguments, 100k-deep
    JSON, pickle/YAML/msgpack, unknown and built-in task names, callbacks, far ETAs, oversized
    entries: the worker survives all of them, dead-letters each once with its reason, never
    logs their content, and scores a good batch sent after them."""
    cases = hostile_messages()
    client = redis.Redis.from_url(redis_url)
    try:
        for _, _, entry in cases:
            client.lpush(QUEUE, entry)
        client.lpush(QUEUE, envelope(task_body([payload(range(3), ["length"], salt="after")]))[1])
    finally:
        client.close()

    scores = tmp_path / "scores.jsonl"
    assert wait_for(lambda: len(read_scores(scores)) == 3, 60), worker.text()[-3000:]
    assert worker.proc.poll() is None
    letters = _dlq(redis_url)
    assert {d.message_key: d.reason for d in letters} == {key: reason for reason, key, _ in cases}
    assert len(letters) == len(cases)
    for letter in letters:
        assert not letter.retryable
        assert letter.error
        assert MARKER not in letter.model_dump_json()
    # The size cap comes before decoding: oversized bodies that are not JSON are too large, not bad JSON.
    too_large = [d for d in letters if d.reason == "payload_too_large"]
    assert len(too_large) == 2
    assert all("TRACESCORE_MAX_PAYLOAD_BYTES" in d.error for d in too_large)

    status = _status(redis_url, monkeypatch, capsys)
    assert status["dead_letters"] == len(cases)
    assert status["dead_letters_by_reason"] == dict(collections.Counter(reason for reason, _, _ in cases))

    log = worker.text()
    assert MARKER not in log
    assert "message_refused" in log
    assert "Traceback" not in log


def test_a_dead_letter_keeps_a_batch_by_its_own_size_not_its_escaped_body(redis_url: str, tmp_path: Path) -> None:
    """kombu re-encodes a retried message with ASCII escapes (a CJK character: 6 bytes, not 3):
    a batch under the 1 MiB a letter keeps, in a body over it, is still kept with its letter."""
    bad = {"batch_id": "cjk", "requests": [{"spans": "漢字" * 140_000}]}  # valid JSON, not a ScoreBatch
    body = json.dumps([[bad], {}, _EMBED])  # ensure_ascii: every CJK character escaped
    compact = len(json.dumps(bad, separators=(",", ":"), ensure_ascii=False).encode())
    assert compact < MAX_DEAD_PAYLOAD_BYTES < len(body.encode())
    proc = WorkerProcess("escaped", redis_url, tmp_path, scores_path=tmp_path / "scores.jsonl")  # default cap
    try:
        proc.wait_ready()
        client = redis.Redis.from_url(redis_url)
        try:
            client.lpush(QUEUE, envelope(body)[1])
        finally:
            client.close()
        assert wait_for(lambda: len(_dlq(redis_url)) == 1, 60), proc.text()[-3000:]
    finally:
        proc.stop()
    (letter,) = _dlq(redis_url)
    assert letter.reason == "invalid_payload"
    assert letter.payload == bad


def test_a_refused_message_delivered_twice_is_one_dead_letter(worker: WorkerProcess, redis_url: str,
                                                              tmp_path: Path) -> None:  # fmt: skip
    """The same message coming back (kombu redelivers it, same delivery tag, after a consumer
    restart before its ack) is not dead-lettered a second time, whether the consumer refuses it
    or the task does (a ScoreBatch that does not validate)."""
    _, refused = envelope(json.dumps(MARKER))
    task_id = str(uuid.uuid4())
    _, invalid = envelope(task_body([{"batch_id": "bad", "requests": [{"run": 42}]}]), headers={"id": task_id})
    client = redis.Redis.from_url(redis_url)
    try:
        for entry in (refused, invalid, refused, invalid):
            client.lpush(QUEUE, entry)
        client.lpush(QUEUE, envelope(task_body([payload(range(2), ["length"], salt="twice")]))[1])
    finally:
        client.close()
    assert wait_for(lambda: len(read_scores(tmp_path / "scores.jsonl")) == 2, 60), worker.text()[-3000:]
    assert sorted(d.reason for d in _dlq(redis_url)) == ["bad_body", "invalid_payload"]
    assert worker.text().count("duplicate=True") == 2


@pytest.mark.parametrize("batch_id", [5, ["a", "list"], {"an": "object"}, None, True])
def test_a_batch_whose_id_is_not_text_is_one_dead_letter(worker: WorkerProcess, redis_url: str, tmp_path: Path,
                                                         batch_id: Any) -> None:  # fmt: skip
    """A batch id of another JSON type (valid JSON, not a ScoreBatch) is an invalid_payload letter
    without a batch id, not a letter that fails to validate: before, the letter was refused each
    time and the message requeued for ever. The worker goes on scoring."""
    bad = {"batch_id": batch_id, "requests": [{"run": 42, "scorer_ids": ["length"]}]}
    client = redis.Redis.from_url(redis_url)
    try:
        client.lpush(QUEUE, envelope(task_body([bad]))[1])
        client.lpush(QUEUE, envelope(task_body([payload(range(1), ["length"], salt="not-text")]))[1])
    finally:
        client.close()
    assert wait_for(lambda: len(read_scores(tmp_path / "scores.jsonl")) == 1, 60), worker.text()[-3000:]
    assert wait_for(lambda: len(_dlq(redis_url)) == 1, 30), worker.text()[-3000:]
    (letter,) = _dlq(redis_url)
    assert (letter.reason, letter.batch_id, letter.payload) == ("invalid_payload", None, bad)
    assert "batch_requeued" not in worker.text()


def test_a_refusal_the_store_cannot_record_is_kept_until_it_can(redis_url: str, tmp_path: Path) -> None:
    """With the score store down the refused message goes back to the queue (not lost, not
    logged); once the store is up it becomes its one dead letter."""
    from tests._redis import RedisServer

    store = RedisServer()  # not started yet: the store is down
    worker = WorkerProcess(
        "store-down", redis_url, tmp_path, scores_path=tmp_path / "scores.jsonl",
        env={"TRACESCORE_REDIS_URL": store.url(11)},
    )  # fmt: skip
    try:
        worker.wait_ready()
        tag, entry = envelope(json.dumps(MARKER))
        client = redis.Redis.from_url(redis_url)
        try:
            client.lpush(QUEUE, entry)
            assert wait_for(lambda: "message_refusal_not_recorded" in worker.text(), 30), worker.text()[-3000:]
            assert worker.proc.poll() is None
            store.start()
            assert wait_for(lambda: len(_dlq(store.url(11))) == 1, 30), worker.text()[-3000:]
            (letter,) = _dlq(store.url(11))
            assert (letter.reason, letter.message_key) == ("bad_body", f"msg:{tag}")
            assert wait_for(lambda: client.llen(QUEUE) == 0 and client.hlen("unacked") == 0, 10)
        finally:
            client.close()
        assert MARKER not in worker.text()
    finally:
        worker.stop()
        store.close()


def _cli(args: list[str], redis_url: str, monkeypatch: pytest.MonkeyPatch,
         capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:  # fmt: skip
    """``tracescore <args>`` against ``redis_url``: its exit code, and stdout and stderr together."""
    from worker.cli import main

    monkeypatch.setenv("TRACESCORE_BROKER_URL", redis_url)
    get_settings.cache_clear()
    try:
        capsys.readouterr()
        code = main(args)
        said = capsys.readouterr()
        return code, said.out + said.err
    finally:
        get_settings.cache_clear()


def test_a_producer_forging_the_screens_refusal_header_puts_none_of_its_text_in_a_letter(
    worker: WorkerProcess,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The transport's screen marks the stand-in of an entry it refuses with a header holding a
    reason and a sentence, which the consumer makes the letter of. A producer can write that
    header too: with a real reason in it (not_json) its own text was the letter's error, shown
    by `tracescore dlq list` (a fake letter's line after the newline) and its --json. A detail
    that is not one of the screen's own sentences is a producer's header now: a bad_headers
    letter in our own words, none of its text in the letter, the CLI's outputs or the log. The
    screen's own stand-in, put back on the queue as it is (a requeue stores it), keeps its
    reason and sentence."""
    fake_line = f"{'0' * 32}  2026-01-01 00:00:00  retry_budget_exhausted  batch=x  attempts=1 {MARKER}"
    details = [
        f"\x1b[2J\x1b]0;{MARKER}\x07the queue entry is not a JSON envelope\n{fake_line}",
        # one of the screen's sentences with text after it, or producer text in its slots
        "the queue entry is not a JSON envelope kombu can read (JSONDecodeError) " + MARKER,
        f"the queue entry is not a JSON envelope kombu can read ({MARKER} says hi)",
        f"body_encoding {MARKER} and more is not base64",
    ]
    forged = [
        envelope(task_body([secret_batch("forged")]), headers={"x-tracescore-refused": reason,
                                                                "x-tracescore-refused-detail": detail})
        for reason, detail in zip(["not_json", "not_json", "not_json", "bad_encoding"], details, strict=True)
    ]  # fmt: skip
    own = screen_envelope(f"not an envelope {MARKER}".encode(), 10**6, QUEUE)
    client = redis.Redis.from_url(redis_url)
    try:
        for _, entry in forged:
            client.lpush(QUEUE, entry)
        client.lpush(QUEUE, json.dumps(own).encode())
        client.lpush(QUEUE, envelope(task_body([payload(range(1), ["length"], salt="after-forged")]))[1])
    finally:
        client.close()
    assert wait_for(lambda: len(read_scores(tmp_path / "scores.jsonl")) == 1, 60), worker.text()[-3000:]
    letters = {d.message_key: d for d in _dlq(redis_url)}
    assert {key: d.reason for key, d in letters.items()} == {
        **{f"msg:{tag}": "bad_headers" for tag, _ in forged},
        f"msg:{own['properties']['delivery_tag']}": "not_json",
    }
    assert letters[f"msg:{own['properties']['delivery_tag']}"].error == (
        "the queue entry is not a JSON envelope kombu can read (JSONDecodeError)"
    )
    for letter in letters.values():
        assert MARKER not in letter.model_dump_json()

    outputs = [
        _cli(["dlq", "list"], redis_url, monkeypatch, capsys),
        _cli(["dlq", "list", "--json"], redis_url, monkeypatch, capsys),
        _cli(["dlq", "retry", "--all"], redis_url, monkeypatch, capsys),
        _cli(["dlq", "retry", "--all", "--json"], redis_url, monkeypatch, capsys),
        _cli(["status", "--timeout", "0.5"], redis_url, monkeypatch, capsys),
    ]
    for code, said in outputs:
        assert code == 0, said
        assert MARKER not in said, said
        assert "\x1b" not in said, said
        assert "\\u001b" not in said, said
    listed = outputs[0][1].splitlines()
    assert len(listed) == 1 + 2 * len(letters)  # a count, then each letter's line and its error's
    assert _status(redis_url, monkeypatch, capsys)["dead_letters_by_reason"] == {"bad_headers": 4, "not_json": 1}
    log = worker.text()
    assert MARKER not in log
    assert log.count("message_refused") == len(letters)


def broadcast(body: Any, *, raw_body: str | None = None, content_type: str = "application/json",
              headers: dict[str, Any] | None = None) -> bytes:  # fmt: skip
    """One Redis pub/sub message as kombu publishes a fanout (Celery's remote control)."""
    encoded = raw_body if raw_body is not None else base64.b64encode(json.dumps(body).encode()).decode()
    return json.dumps(
        {
            "body": encoded,
            "content-encoding": "utf-8",
            "content-type": content_type,
            "headers": {"clock": 1, **(headers or {})},
            "properties": {
                "delivery_mode": 2,
                "delivery_info": {"exchange": "celery.pidbox", "routing_key": ""},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
    ).encode()


def hostile_broadcasts() -> list[tuple[str, bytes]]:
    """(expected reason, pub/sub message) for each kind of bad remote-control broadcast."""
    ping = {"method": "ping", "arguments": {}, "destination": None, "reply_to": None, "ticket": None}
    return [
        ("not_json", f"not an envelope {MARKER}".encode()),
        ("bad_envelope", json.dumps({"body": MARKER}).encode()),
        ("payload_too_large", b"x" * (MAX_PAYLOAD * 3) + MARKER.encode()),
        ("not_json", broadcast(None, raw_body=f"!!{MARKER}")),  # not base64
        ("not_json", broadcast(None, raw_body=base64.b64encode(f"[{MARKER}".encode()).decode())),
        ("too_deep", broadcast(None, raw_body=base64.b64encode(b"[" * 100_000 + b"]" * 100_000).decode())),
        ("content_type_refused", broadcast(ping, content_type="application/x-python-serialize")),
        ("bad_body", broadcast([MARKER])),
        # (a name shaped like a plain token is named in the log, as a queue message's task name)
        ("unknown_command", broadcast({**ping, "method": f"shutdown {MARKER}"})),
        ("unknown_command", broadcast({**ping, "method": "celery.ping"})),
        ("bad_body", broadcast({**ping, "arguments": MARKER})),
        ("bad_body", broadcast({**ping, "arguments": {f"{MARKER} " * 50: 1}})),
        ("bad_body", broadcast({**ping, "destination": MARKER})),
        ("bad_body", broadcast({**ping, "reply_to": {"exchange": 1}})),
        ("bad_body", broadcast(ping, headers={"clock": MARKER})),
    ]


def test_hostile_broadcasts_are_refused_named_and_counted_and_the_worker_keeps_scoring(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Celery's remote control reads Redis pub/sub, where the queue's screen does not look: kombu
    logged an unparsable broadcast with its bytes, Celery a malformed command with a traceback,
    and a worker event without a hostname (gossip) restarted the consumer. Each hostile
    broadcast is refused before kombu decodes it, named in the log and counted by reason, and
    is no dead letter; the worker listens to no other worker's events, answers a real ping
    (``tracescore status``) and goes on scoring."""
    from tests._redis import free_port
    from tests.worker.test_metrics import scrape, series

    port = free_port()
    worker = WorkerProcess(
        "broadcasts",
        redis_url,
        tmp_path,
        scores_path=tmp_path / "scores.jsonl",
        env={
            "TRACESCORE_MAX_PAYLOAD_BYTES": str(MAX_PAYLOAD),
            "TRACESCORE_METRICS_PORT": str(port),
            "TRACESCORE_METRICS_HOST": "127.0.0.1",
            "TRACESCORE_METRICS_DIR": str(tmp_path / "metrics"),
            "OTEL_EXPORTER_OTLP_ENDPOINT": "",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "",
        },
    )
    db = redis_url.rsplit("/", 1)[1]
    client = redis.Redis.from_url(redis_url)
    try:
        worker.wait_ready()
        # The control channel is subscribed once the consumer has started it.
        assert wait_for(lambda: client.publish(f"/{db}.celery.pidbox", b"") == 1, 30), worker.text()[-3000:]
        # No gossip: a worker event reaches nobody (one without a hostname restarted the consumer).
        assert client.publish(f"/{db}.celeryev/worker.heartbeat", broadcast({"type": "worker-heartbeat"})) == 0
        cases = hostile_broadcasts()
        for _, message in cases:
            assert client.publish(f"/{db}.celery.pidbox", message) == 1
        expected = collections.Counter(reason for reason, _ in cases)
        assert wait_for(lambda: worker.text().count("broadcast_refused") == len(cases), 30), worker.text()[-3000:]

        status = _status(redis_url, monkeypatch, capsys)  # a real ping through the same screen
        (node,) = status["workers"]
        assert node.startswith("broadcasts@"), status
        assert status["dead_letters"] == 0  # a broadcast is no queue's message

        client.lpush(QUEUE, envelope(task_body([payload(range(2), ["length"], salt="broadcast")]))[1])
        assert wait_for(lambda: len(read_scores(tmp_path / "scores.jsonl")) == 2, 60), worker.text()[-3000:]
        refused = {
            dict(labels)["reason"]: v
            for labels, v in series(scrape(port), "tracescore_broadcasts_refused_total").items()
        }
        assert refused == expected
        assert worker.proc.poll() is None
    finally:
        client.close()
        worker.stop()
    log = worker.text()
    assert MARKER not in log
    assert "Traceback" not in log
    assert "Connection to broker lost" not in log
    for reason in expected:
        assert f"reason={reason}" in log
    assert "celery.ping is not one of Celery's remote-control commands" in log


def _screened(**headers: Any) -> Refusal | None:
    """``check_message``'s refusal of a valid batch's message with ``headers``."""
    task_id = str(uuid.uuid4())
    message = SimpleNamespace(
        headers={"task": SCORE_TASK_NAME, "id": task_id, "root_id": task_id, **headers},
        body=task_body([payload(range(1), ["length"], salt="waits")]).encode(),
        content_type="application/json",
        content_encoding="utf-8",
    )
    refusal, _ = check_message(message, get_settings(), frozenset({SCORE_TASK_NAME}))
    return refusal


def test_a_message_waiting_days_for_the_store_passes_the_screen_and_a_forged_count_does_not() -> None:
    """Waits for the store are retries, not tries: a message of 100 000 retries all waits (days
    of a store refusing writes) passes, as does one with 1000 tries besides them; a count of
    tries past 1000, waits the retries do not hold, or a count that is no integer is refused,
    each with its sentence."""
    for retries, waits in ((100_000, 100_000), (101_000, 100_000), (1000, None), (0, 0)):
        counts = {"retries": retries} if waits is None else {"retries": retries, STORE_WAITS: waits}
        assert _screened(**counts) is None, counts
    tries = "the retries header less tracescore_store_waits (the message's tries) is over 1000"
    waits_said = "the tracescore_store_waits header is not an integer from 0 to the retries header"
    retries_said = "the retries header is not an integer from 0 to 1000000000"
    for counts, said in (
        ({"retries": 1001}, tries),
        ({"retries": 101_001, STORE_WAITS: 100_000}, tries),
        ({"retries": 2, STORE_WAITS: 3}, waits_said),
        ({"retries": 2, STORE_WAITS: -1}, waits_said),
        ({"retries": 2, STORE_WAITS: "1"}, waits_said),
        ({"retries": 2, STORE_WAITS: True}, waits_said),
        ({"retries": 2, STORE_WAITS: 1.0}, waits_said),
        ({"retries": 10**9 + 1, STORE_WAITS: 10**9 + 1}, retries_said),
        ({"retries": 10**400, STORE_WAITS: 10**400}, retries_said),
        ({"retries": -1}, retries_said),
        ({"retries": "many"}, retries_said),
    ):
        assert _screened(**counts) == Refusal("bad_headers", said), counts


def test_a_stand_in_shows_a_value_exactly_when_it_is_a_plain_id_and_reads_its_own_sentence_back() -> None:
    """The transport screen's stand-in names a value (here the body encoding) when it is a plain
    id, and the consumer reads the stand-in's sentence back with the same pattern (tracing.queue's
    PLAIN_ID_PATTERN, plain_id's): a plain id the sentence could not hold would make the screen
    refuse its own stand-in as a producer's forgery (bad_headers) when it comes back from Redis."""
    for token in ("a", "A" * 128, "azAZ09_.:@/+=-", "A" * 129, "a b", "é", "a\n", f"{MARKER} x"):
        _, entry = envelope(task_body([MARKER]), body_encoding=token)
        stand_in = screen_envelope(entry, 10**6, QUEUE)
        refusal, _ = check_message(SimpleNamespace(headers=stand_in["headers"]), get_settings(), frozenset())
        shown = plain_id(token)
        assert shown == (re.fullmatch(PLAIN_ID_PATTERN, token) is not None), token
        said = f"body_encoding {token if shown else '(not shown)'} is not base64"
        assert refusal == Refusal("bad_encoding", said), token


def test_past_the_lists_bound_the_oldest_dead_letters_go_counted_and_the_worker_scores_on(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A producer whose every message is refused: past TRACESCORE_DLQ_MAX_LETTERS, or
    TRACESCORE_DLQ_MAX_BYTES (a letter keeps its message: a count of letters alone bounded
    nothing of their size), the oldest letters go, whichever path refused them (the consumer's
    screen, the task), counted as dropped by reason and logged without content; the newest stay,
    the byte total is theirs, and the worker scores on."""
    bound = 30_000  # room for one of the large letters, not two
    bounds = {"TRACESCORE_DLQ_MAX_LETTERS": "3", "TRACESCORE_DLQ_MAX_BYTES": str(bound)}
    proc = WorkerProcess("bounded", redis_url, tmp_path, scores_path=tmp_path / "scores.jsonl", env=bounds)
    refused = [envelope(json.dumps(f"{MARKER} {n}"))[1] for n in range(3)]  # the screen: bad_body, no payload kept
    # The task: invalid_payload, each letter keeping its 20 kB message.
    large = [{"batch_id": f"bad-{n}", "requests": [{"run": n, "filler": "x" * 20_000}]} for n in range(2)]
    invalid = [envelope(task_body([batch]))[1] for batch in large]
    try:
        proc.wait_ready()
        client = redis.Redis.from_url(redis_url)
        try:
            for entry in [*refused, *invalid]:
                client.lpush(QUEUE, entry)
            client.lpush(QUEUE, envelope(task_body([payload(range(1), ["length"], salt="bounded")]))[1])
        finally:
            client.close()
        assert wait_for(lambda: len(read_scores(tmp_path / "scores.jsonl")) == 1, 60), proc.text()[-3000:]
    finally:
        proc.stop()
    # The letters past the count bound went first (two bad_body), then, the second large letter
    # past the byte bound, the last bad_body and the first large one.
    (kept,) = _dlq(redis_url)
    assert (kept.reason, kept.batch_id) == ("invalid_payload", "bad-1")
    for name, value in bounds.items():
        monkeypatch.setenv(name, value)
    status = _status(redis_url, monkeypatch, capsys)
    assert status["dead_letters_by_reason"] == {"invalid_payload": 1}
    assert status["dead_letters_dropped"] == {"bad_body": 3, "invalid_payload": 1}
    assert 20_000 < status["dead_letters_bytes"] == len(kept.model_dump_json().encode()) <= bound
    assert status["dead_letters_max_bytes"] == bound
    log = proc.text()
    # (a line a minute, not one a push: the two pushes that dropped came within it)
    assert log.count("dead_letters_dropped_past_bound") == 1
    assert MARKER not in log


def _refused_then_the_next_scored(worker: WorkerProcess, redis_url: str, tmp_path: Path, bad: dict[str, Any]) -> Any:
    """``bad`` (a message under the byte cap) and then a good batch of two runs sent: ``bad`` is
    one invalid_payload letter, not retryable (returned), and the good batch's runs are scored."""
    assert len(json.dumps(bad)) < MAX_PAYLOAD
    after = payload(range(2), ["length"], salt=f"after-{bad['batch_id']}")
    client = redis.Redis.from_url(redis_url)
    try:
        client.lpush(QUEUE, envelope(task_body([bad]))[1])
        client.lpush(QUEUE, envelope(task_body([after]))[1])
    finally:
        client.close()
    scores = tmp_path / "scores.jsonl"
    assert wait_for(lambda: len(_dlq(redis_url)) == 1, 60), worker.text()[-3000:]
    (letter,) = _dlq(redis_url)
    assert (letter.reason, letter.retryable) == ("invalid_payload", False)
    assert wait_for(lambda: len(read_scores(scores)) == 2, 60), worker.text()[-3000:]
    assert {r["trace_id"] for r in read_scores(scores)} == {r["spans"][0]["trace_id"] for r in after["requests"]}
    return letter


def test_a_request_naming_a_flood_of_scorer_ids_is_one_dead_letter_not_a_flood_of_records(
    worker: WorkerProcess, redis_url: str, tmp_path: Path
) -> None:
    """One request of 3 runs listing 40,000 distinct unknown scorer ids (a 0.3 MiB message) made
    the worker write 120,000 UnknownScorerError records, each stored and sent to every sink (a
    6.7 MiB one of 1,000,000 ids: 3,000,000). More ids than ``MAX_SCORER_IDS`` is no request:
    the message is one invalid_payload letter naming the field and the bound, no record is
    written, and the worker scores the next batch."""
    from tracing.queue import MAX_SCORER_IDS

    flood = payload(range(3), ["length"], salt="flood")
    first = flood["requests"][0]
    spans = [{**r["spans"][0], "trace_id": first["spans"][0]["trace_id"]} for r in flood["requests"]]
    flood["requests"] = [
        {
            **{k: v for k, v in first.items() if k != "target_span_id"},
            "spans": spans,
            "target_span_ids": [s["span_id"] for s in spans],
            "scorer_ids": ["length", *(f"u{i}" for i in range(40_000))],
        }
    ]
    letter = _refused_then_the_next_scored(worker, redis_url, tmp_path, flood)
    assert "scorer_ids" in letter.error
    assert f"at most {MAX_SCORER_IDS}" in letter.error


def test_a_batch_asking_more_run_scorer_pairs_than_the_bound_is_one_dead_letter_not_a_flood_of_records(
    worker: WorkerProcess, redis_url: str, tmp_path: Path
) -> None:
    """Each (run, scorer id) pair a message asks for is a score or an error record: an 8 MiB
    message held ~31,000 minimal runs x 100 unknown ids, 3.1M records, each stored and sent to
    every sink, a worker held for minutes (1,000 x 100 took 5.6 s). A message asking for more than
    ``MAX_BATCH_PAIRS`` over its requests (here two of 100 ids, 501 and 500 runs: 100,100 pairs
    in 0.2 MiB) is one invalid_payload letter naming the bound, no record is written, and the
    worker scores the next batch."""
    from tracing import SpanRecord
    from tracing.queue import MAX_BATCH_PAIRS, MAX_SCORER_IDS, request_json, spans_request

    ids = [f"u{i}" for i in range(MAX_SCORER_IDS - 1)] + ["length"]
    requests = []
    for salt, runs in (("a", 501), ("b", 500)):
        trace = hashlib.md5(f"pairs-{salt}".encode()).hexdigest()
        spans = [SpanRecord(trace_id=trace, span_id=f"{i + 1:016x}", name="agent.run") for i in range(runs)]
        requests.append(json.loads(request_json(spans_request(spans, [s.span_id for s in spans], ids))))
    flood = {"batch_id": "pairs-flood", "requests": requests}
    letter = _refused_then_the_next_scored(worker, redis_url, tmp_path, flood)
    assert f"{MAX_BATCH_PAIRS + 100:,}" in letter.error
    assert f"at most {MAX_BATCH_PAIRS:,}" in letter.error
    assert "MAX_BATCH_PAIRS" in letter.error


def test_a_batch_with_a_field_it_does_not_know_is_one_dead_letter_naming_it(
    worker: WorkerProcess, redis_url: str, tmp_path: Path
) -> None:
    """A batch's envelope with a field no release writes was scored, the field dropped unread
    (its requests refuse theirs). It is an invalid_payload letter naming a plain field name
    (a name of the producer's text is not shown), its runs unscored; the worker goes on."""
    odd = payload(range(1), ["length"], salt="odd-field")
    named = {**odd, "priority": 5}
    hostile = {**odd, "batch_id": "odd-2", f"{MARKER} {'x' * 10_000}": True}
    client = redis.Redis.from_url(redis_url)
    try:
        for bad in (named, hostile):
            client.lpush(QUEUE, envelope(task_body([bad]))[1])
        client.lpush(QUEUE, envelope(task_body([payload(range(2), ["length"], salt="after-odd")]))[1])
    finally:
        client.close()
    scores = tmp_path / "scores.jsonl"
    assert wait_for(lambda: len(_dlq(redis_url)) == 2, 60), worker.text()[-3000:]
    assert wait_for(lambda: len(read_scores(scores)) == 2, 60), worker.text()[-3000:]
    letters = {d.batch_id: d for d in _dlq(redis_url)}
    assert {d.reason for d in letters.values()} == {"invalid_payload"}
    assert "priority: Extra inputs are not permitted" in letters[odd["batch_id"]].error
    assert "<field>: Extra inputs are not permitted" in letters["odd-2"].error
    assert all(MARKER not in d.error for d in letters.values())
    assert odd["requests"][0]["spans"][0]["trace_id"] not in {r["trace_id"] for r in read_scores(scores)}
    assert MARKER not in worker.text()
