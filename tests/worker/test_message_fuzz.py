"""Hostile queue messages by property-based fuzzing, through the worker's own code in this process.

Each input starts as a valid message built the way producers build it (``spans_request``,
``task_message``, kombu's Redis envelope as ``Publisher`` writes it), then one or a few
structural mutations are applied: at the Redis entry (kombu's envelope), the headers, the raw
body, or anywhere in the decoded batch. It then goes the way a worker takes it: the transport's
screen (``screen_envelope``), kombu's decoding of the entry and its message (``_ScreenedMessage``),
the consumer's screen (``check_message``, and its ``refuse``, which dead-letters), and for a
message the screen passes, the task body itself (``score_batch_task.apply``) on a runtime of the
in-memory store twins. For every input: it is refused or dead-lettered with a reason of the
known set, counted once, or scored; nothing but that escapes; no refusal, letter or log line
carries the agent content or the secret planted in it.

Deterministic (``derandomize``): CI runs the same examples every time.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import structlog
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kombu import serialization as kombu_serialization
from kombu.transport.virtual import base as kombu_virtual

from tests.worker._batches import kombu_entry
from tracing import SpanRecord
from tracing.queue import SCORE_TASK_NAME, ScoreBatch, plain_id, request_json, spans_request, task_message
from worker import _task
from worker._app import score_batch_task
from worker._guard import GuardedConsumer, Refusal, _ScreenedMessage, check_message, screen_envelope
from worker._logs import CountedLog
from worker._loop import stop_loop
from worker._registry import load_registry
from worker._runtime import WorkerRuntime
from worker._scoring import ScoringDeps
from worker._settings import Settings
from worker.store import DeadLetter, MemoryDeadLetters, MemoryScoreStore

# Planted in the agent content and in every text a mutation writes. Not a "plain token" (it has
# spaces): the guard shows a header's value when it is a short plain token (``_token``).
MARKER = "AGENT said: the code is 4417"
SECRET = "sk-live SECRET 9c2e"
QUEUE = "tracescore"
MAX_PAYLOAD = 64 * 1024
ENTRY_LIMIT = MAX_PAYLOAD * 4 // 3 + 64 * 1024

# Every reason a refusal or a dead letter of a hostile message may carry.
SCREEN_REASONS = {
    "payload_too_large",
    "not_json",
    "bad_envelope",
    "too_deep",
    "compression_refused",
    "bad_encoding",
    "content_type_refused",
    "not_a_task",
    "unknown_task",
    "bad_headers",
    "eta_too_far",
    "bad_body",
    "bad_arguments",
    "callbacks_refused",
    "unreadable",
    "invalid_task",
    "invalid_payload",
}
TASK_REASONS = {"invalid_payload", "payload_too_large", "payload_not_json"}


# --- valid messages, as producers build them ----------------------------------------------------


def _span(trace: str, n: int, parent: str | None, agent: bool) -> SpanRecord:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent" if agent else "chat",
        "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": f"{MARKER} q"}]}]),
        "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": f"{MARKER} {SECRET}"}]}]
        ),
    }
    return SpanRecord(
        trace_id=trace,
        span_id=f"{n + 1:016x}",
        name="agent.run" if agent else "chat m",
        parent_span_id=parent,
        start_time_ns=1_700_000_000_000_000_000 + n,
        end_time_ns=1_700_000_000_000_000_500 + n,
        attributes=attributes,
    )


@st.composite
def valid_batches(draw: st.DrawFn) -> ScoreBatch:
    requests = []
    for r in range(draw(st.integers(1, 2))):
        trace = f"{r + 1:032x}"
        runs = draw(st.integers(1, 2))
        spans: list[SpanRecord] = []
        targets: list[str] = []
        for k in range(runs):
            agent = _span(trace, 10 * k, None, True)
            spans += [agent, _span(trace, 10 * k + 1, agent.span_id, False)]
            targets.append(agent.span_id)
        scorers = draw(st.lists(st.sampled_from(["length", "no_such_scorer"]), min_size=1, max_size=2, unique=True))
        job = draw(st.sampled_from([None, "job-1"]))
        requests.append(spans_request(spans, targets, scorers, 1.7e9, source="backfill" if job else "live", job_id=job))
    return ScoreBatch.model_construct(batch_id=uuid.UUID(int=draw(st.integers(0, 2**32))).hex, requests=requests)


# --- mutations ----------------------------------------------------------------------------------

_deep: Any = [MARKER]
for _ in range(200):
    _deep = [_deep]

hostile_values = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, -1, 2**63, 2**64 + 1, -(2**70), 10**400 // 10**300]),
    st.sampled_from([1.5, -0.0, 1e308, math.nan, math.inf, -math.inf]),
    st.sampled_from(
        [
            MARKER,
            SECRET,
            "",
            f"\ud800{MARKER}",
            f"{MARKER}\x00\n\x1b[31m",
            MARKER * 500,
            "0" * 16,
            "zz" * 8,
            "ABCDEF0123456789",
            "not base64 %%% " + MARKER,
            "tracescore.score_batch",
            "live",
            "1e999",
        ]
    ),
    st.just([]),
    st.just({}),
    st.just([MARKER, {"k": SECRET}]),
    st.just({MARKER: SECRET}),
    st.just({"__type__": "uuid", "__value__": MARKER}),
    st.just({"__type__": "bytes", "__value__": SECRET}),
    st.just(_deep),
).map(copy.deepcopy)  # (a later mutation must not change the shared value)


def _paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*at, i))


def _parent(root: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        root = root[key]
    return root


@st.composite
def mutate_tree(draw: st.DrawFn, root: Any) -> Any:
    """``root`` (decoded JSON) with one structural change at any depth."""
    root = copy.deepcopy(root)
    paths = [p for p in _paths(root) if p]
    if not paths:
        return draw(hostile_values)
    path = draw(st.sampled_from(paths))
    parent, key = _parent(root, path), path[-1]
    op = draw(st.sampled_from(["drop", "duplicate", "retype", "retype", "add", "wrap"]))
    if op == "drop":
        del parent[key]
    elif op == "duplicate" and isinstance(parent, list):
        parent.insert(key, copy.deepcopy(parent[key]))
    elif op == "duplicate":
        parent[f"{key}"] = parent[key]
    elif op == "add" and isinstance(parent[key] if isinstance(parent[key], dict) else parent, dict):
        target = parent[key] if isinstance(parent[key], dict) else parent
        target[draw(st.sampled_from([MARKER, "run", "target_span_id", "__type__", "spans"]))] = draw(hostile_values)
    elif op == "wrap":
        parent[key] = draw(st.sampled_from([[parent[key]], {"value": parent[key]}]))
    else:
        parent[key] = draw(hostile_values)
    return root


def _json_bytes(value: Any, ascii_only: bool) -> bytes:
    return json.dumps(value, ensure_ascii=ascii_only, allow_nan=True).encode("utf-8", "surrogatepass")


@dataclass
class Case:
    entry: bytes
    # What the test expects may pass: a valid message's runs, by score pair count.
    mutated: list[str] = field(default_factory=list)


@st.composite
def hostile_entries(draw: st.DrawFn) -> Case:
    batch = draw(valid_batches())
    message = task_message(batch, "tracescore-exporter")
    body: Any = json.loads(message.body)
    headers: dict[str, Any] = dict(message.headers)
    raw_body: bytes | None = None
    entry_mutations: list[str] = []
    mutated: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["batch", "batch", "batch", "body", "headers", "envelope", "raw_body"]))
        mutated.append(where)
        shaped = isinstance(body, list) and body and isinstance(body[0], list) and body[0]
        if where == "batch" and shaped:
            body[0][0] = draw(mutate_tree(body[0][0]))
        elif where in ("body", "batch"):
            body = draw(mutate_tree({"body": body})).get("body") if draw(st.booleans()) else draw(hostile_values)
        elif where == "headers":
            name = draw(
                st.sampled_from(
                    ["task", "id", "retries", "eta", "expires", "timelimit", "root_id", "group", "shadow",
                     "compression", "x-tracescore-refused", "x-tracescore-refused-detail", "argsrepr",
                     "tracescore_body_bytes", "tracescore_store_waits", "parent_id", "lang", MARKER]
                )
            )  # fmt: skip
            if draw(st.booleans()):
                headers.pop(name, None)
            else:
                headers[name] = draw(
                    hostile_values
                    | st.sampled_from(["2000-01-01T00:00:00", "9999-12-31T23:59:59+00:00", "invalid_payload"])
                    | st.sampled_from([[1, 2], [None, 1e9], [0, 0], "celery.backend_cleanup", 5, 1001])
                )
        elif where == "raw_body":
            raw_body = draw(
                st.sampled_from(
                    [
                        b"\xff\xfe" + MARKER.encode(),
                        b"\xef\xbb\xbf[[{}],{},null]",
                        ("[" * 5000 + "]" * 5000).encode(),
                        b'[[{"batch_id": "\xed\xa0\x80"}], {}, null]',
                        MARKER.encode() * 3000,
                        b"",
                        b"[[{}], {}, {}]" + MARKER.encode(),
                    ]
                )
            )
        else:
            entry_mutations.append(
                draw(
                    st.sampled_from(
                        ["content-type", "content-encoding", "body_encoding", "priority", "delivery_tag",
                         "delivery_info", "not_base64", "type_hook_header", "type_hook_property", "bom",
                         "utf16", "headers_not_object", "no_properties", "truncate"]
                    )
                )
            )  # fmt: skip
    ascii_only = draw(st.booleans())
    encoded = raw_body if raw_body is not None else _json_bytes(body, ascii_only)
    entry = kombu_entry(encoded, headers, message.task_id)
    hostile = draw(hostile_values)
    tail = b""
    encoding = "utf-8"
    prefix = b""
    for mutation in entry_mutations:
        props = entry.setdefault("properties", {})
        if mutation in ("content-type", "content-encoding"):
            entry[mutation] = draw(st.sampled_from(["application/x-python-serialize", "utf-16", "binary", None, 5]))
        elif mutation in ("body_encoding", "priority", "delivery_tag", "delivery_info"):
            props[mutation] = hostile
        elif mutation == "not_base64":
            entry["body"] = "%%% " + MARKER
        elif mutation == "type_hook_header":
            entry["headers"] = {**entry["headers"], "x": draw(st.sampled_from(
                [{"__type__": "uuid", "__value__": MARKER}, {"__type__": MARKER, "__value__": 1},
                 {"__type__": "datetime", "__value__": MARKER}]))}  # fmt: skip
        elif mutation == "type_hook_property":
            props["reply_to"] = {"__type__": "decimal", "__value__": MARKER}
        elif mutation == "bom":
            prefix = b"\xef\xbb\xbf"
        elif mutation == "utf16":
            encoding = "utf-16"
        elif mutation == "headers_not_object":
            entry["headers"] = hostile
        elif mutation == "no_properties":
            del entry["properties"]
        else:
            tail = b"TRUNCATED"
    text = json.dumps(entry, allow_nan=True)
    data = prefix + (text[: len(text) // 2] if tail else text).encode(encoding, "surrogatepass")
    return Case(data, mutated + entry_mutations)


# --- the worker's path, in this process ---------------------------------------------------------


class _Channel:
    """What kombu's message needs of its channel: its body decoding and the ack."""

    codecs = kombu_virtual.Channel.codecs
    decode_body = kombu_virtual.Channel.decode_body
    no_ack_consumers = None

    def __init__(self) -> None:
        self.acked: list[str] = []

    def basic_ack(self, delivery_tag: str, multiple: bool = False) -> None:
        self.acked.append(delivery_tag)


class _Letters:
    """The consumer's dead letters (``SyncRedisDeadLetters``' push, in memory)."""

    def __init__(self) -> None:
        self.letters: list[DeadLetter] = []

    def push(self, letter: DeadLetter) -> bool:
        self.letters.append(DeadLetter.model_validate_json(letter.model_dump_json()))
        return True


class _Consumer:
    """The ``GuardedConsumer`` state its ``refuse`` reads."""

    refuse = GuardedConsumer.refuse

    def __init__(self) -> None:
        self._dead_letters = _Letters()
        self._not_recorded = CountedLog("message_refusal_not_recorded", logger=structlog.get_logger(), level="error")

    def _connection_errors(self) -> tuple[type[BaseException], ...]:
        return ()


class _StoredLetters(MemoryDeadLetters):
    """The dead letters in memory, each written as Redis keeps it (its JSON): a letter the store
    could not write fails here as it does there."""

    async def push(self, letter: DeadLetter) -> bool:
        return await super().push(DeadLetter.model_validate_json(letter.model_dump_json()))


class _Deliveries:
    async def start(self, task_id: str, token: str) -> int:
        return 0

    async def end(self, task_id: str, token: str) -> bool:
        return True

    def keep(self, task_id: str, token: str) -> None:
        pass


class _Runtime:
    """The runtime, with a short repr (hypothesis shows the test's arguments)."""

    def __init__(self, runtime: WorkerRuntime) -> None:
        self.it = runtime

    def __repr__(self) -> str:
        return "<in-memory runtime>"


@pytest.fixture(scope="module")
def runtime() -> Iterator[_Runtime]:
    worker_settings = Settings(
        broker_url="redis://127.0.0.1:1/0", scorers="tests.worker.sample_scorers", max_payload_bytes=MAX_PAYLOAD
    )
    registry = load_registry("tests.worker.sample_scorers")
    store = MemoryScoreStore()
    deps = ScoringDeps(registry=registry, store=store, run_timeout_s=None)
    built = WorkerRuntime(
        worker_settings,
        registry,
        store,
        _StoredLetters(),
        None,
        None,
        deps,
        0,
        _Deliveries(),  # type: ignore[arg-type]
    )
    patch = pytest.MonkeyPatch()
    patch.setattr(_task, "get_runtime", lambda settings: built)
    try:
        yield _Runtime(built)
    finally:
        patch.undo()
        stop_loop()


def _letters(runtime: WorkerRuntime) -> list[DeadLetter]:
    return asyncio.run(runtime.dead_letters.latest(10**6))


def _clean(text: str) -> None:
    for planted in (MARKER, SECRET, MARKER[:12]):
        assert planted not in text, text[:500]


def deliver(entry: bytes, runtime: WorkerRuntime) -> tuple[str, str | None]:
    """``entry`` through the worker's path; ("refused"|"dead_letter"|"scored", reason)."""
    payload = screen_envelope(entry, ENTRY_LIMIT, QUEUE)  # (as _GuardedChannel._take reads it)
    channel = _Channel()
    message = _ScreenedMessage(payload, channel=channel)
    consumer = _Consumer()
    refusal: Refusal | None
    try:
        refusal, decoded = check_message(message, runtime.settings, frozenset({SCORE_TASK_NAME}))
    except Exception as exc:  # as on_task_received: a screen that crashed refuses the message
        pytest.fail(f"the screen crashed: {type(exc).__name__}")
    if refusal is not None:
        consumer.refuse(message, refusal, decoded)
        (letter,) = consumer._dead_letters.letters
        assert letter.reason in SCREEN_REASONS, letter
        assert channel.acked == [message.delivery_tag]
        _clean(letter.model_dump_json())
        return "refused", letter.reason
    before = len(_letters(runtime))
    # The task's argument as the pool's child reads it: kombu decodes the body once more.
    args = kombu_serialization.loads(message.body, message.content_type, message.content_encoding)[0]
    result = score_batch_task.apply(args=args, task_id=str(uuid.uuid4()))
    assert result.state == "SUCCESS", (result.state, result.traceback)
    letters = _letters(runtime)
    if len(letters) > before:
        assert len(letters) == before + 1
        letter = letters[0]
        assert letter.reason in TASK_REASONS, letter
        _clean(letter.error)
        return "dead_letter", letter.reason
    report = result.result
    assert isinstance(report, dict), report
    # Accepted: the batch's runs are planned and each split run reads back (the crash split).
    batch = ScoreBatch.model_validate(args[0])
    assert report["pairs"] == sum(len(r.target_span_ids) * len(set(r.scorer_ids)) for r in batch.requests)
    for request in batch.requests:
        for one in request.per_target():
            type(request).model_validate_json(request_json(one))
    return "scored", None


@settings(
    max_examples=400,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(case=hostile_entries())
def test_a_hostile_message_is_refused_dead_lettered_or_scored_never_crashes(case: Case, runtime: _Runtime) -> None:
    with structlog.testing.capture_logs() as logs:
        outcome, reason = deliver(case.entry, runtime.it)
    event(f"{outcome}: {reason}")
    _clean(repr(logs))


# --- what the fuzzing found: each a regression test -----------------------------------------------


def _valid_entry(batch_id: str = "b-1") -> dict[str, Any]:
    request = spans_request([_span("1" * 32, 0, None, True)], ["0000000000000001"], ["length"])
    batch = ScoreBatch.model_construct(batch_id=batch_id, requests=[request])
    message = task_message(batch, "tracescore-exporter")
    return kombu_entry(message.body.encode(), dict(message.headers), message.task_id)


def _with(entry: dict[str, Any], where: str, value: Any) -> dict[str, Any]:
    entry = copy.deepcopy(entry)
    entry[where] = {**entry[where], "x": value}
    return entry


def _own_stand_ins() -> dict[str, tuple[str, bytes]]:
    """(reason, entry) for each sentence the transport screen refuses a queue entry with."""
    valid = _valid_entry()

    def changed(where: str, key: str, value: Any) -> bytes:
        entry = copy.deepcopy(valid)
        entry[where][key] = value
        return json.dumps(entry).encode()

    return {
        "too-large": ("payload_too_large", b"x" * (ENTRY_LIMIT + 1)),
        "not-json": ("not_json", b"{not json"),
        "no-tag": ("bad_envelope", json.dumps({"body": ""}).encode()),
        "deep": ("too_deep", json.dumps({**valid, "x": json.loads("[" * 150 + "]" * 150)}).encode()),
        "compressed": ("compression_refused", changed("headers", "compression", "application/x-gzip")),
        "headers": ("bad_encoding", json.dumps({**valid, "headers": [1]}).encode()),
        "delivery-info": ("bad_encoding", changed("properties", "delivery_info", [1])),
        "priority": ("bad_encoding", changed("properties", "priority", -1)),
        "body": ("bad_encoding", json.dumps({**valid, "body": 7}).encode()),
        "body-encoding": ("bad_encoding", changed("properties", "body_encoding", "rot13")),
        "body-encoding-not-shown": ("bad_encoding", changed("properties", "body_encoding", MARKER)),
        "not-base64": ("bad_encoding", json.dumps({**valid, "body": "%%% not base64"}).encode()),
    }


@pytest.mark.parametrize("case", list(_own_stand_ins()))
def test_the_screens_own_stand_in_is_refused_with_its_reason_and_sentence(runtime: _Runtime, case: str) -> None:
    """The consumer now takes a stand-in's reason and sentence only when the sentence is one the
    transport screen writes (a producer can set the same headers): each of the screen's own,
    delivered, and delivered again after a requeue stored it in Redis as it is (JSON), is
    refused with its own reason and sentence, never as a producer's bad_headers."""
    reason, entry = _own_stand_ins()[case]
    payload = screen_envelope(entry, ENTRY_LIMIT, QUEUE)
    first = _ScreenedMessage(payload, channel=_Channel())
    detail = first.headers["x-tracescore-refused-detail"]
    assert (first.headers["x-tracescore-refused"], MARKER in detail) == (reason, False)
    for message in (first, _ScreenedMessage(json.loads(json.dumps(first._raw)), channel=_Channel())):
        refusal, _ = check_message(message, runtime.it.settings, frozenset({SCORE_TASK_NAME}))
        assert refusal == Refusal(reason, detail)


_KOMBU_UNREADABLE = {
    # kombu decodes an object of exactly "__type__" and "__value__" into a value, and fails on
    # one it cannot decode; JSON's own parsers read a BOM and UTF-16, kombu does not.
    "uuid-header": json.dumps(_with(_valid_entry(), "headers", {"__type__": "uuid", "__value__": MARKER})).encode(),
    "unknown-type": json.dumps(_with(_valid_entry(), "headers", {"__type__": MARKER, "__value__": 1})).encode(),
    "decimal-property": json.dumps(
        _with(_valid_entry(), "properties", {"__type__": "decimal", "__value__": MARKER})
    ).encode(),
    "utf8-bom": b"\xef\xbb\xbf" + json.dumps(_valid_entry()).encode(),
    "utf16": json.dumps(_valid_entry()).encode("utf-16"),
}


@pytest.mark.parametrize("entry", list(_KOMBU_UNREADABLE.values()), ids=list(_KOMBU_UNREADABLE))
def test_a_queue_entry_kombu_cannot_decode_is_refused_not_raised(redis_url: str, entry: bytes) -> None:
    """The transport's screen passed these (JSON to its parser), and kombu's decoding of the
    entry then raised out of the channel: the consumer crashed, and again each time the entry
    came back. Now the screen reads the entry as kombu does: a refused stand-in, acked away."""
    from kombu import Connection

    from worker._guard import GuardedRedisTransport

    client = redis.Redis.from_url(redis_url)
    try:
        client.lpush("fuzzq", entry)
        with Connection(redis_url, transport=GuardedRedisTransport) as connection:
            message = connection.SimpleQueue("fuzzq").get(timeout=10)
            assert message.headers["x-tracescore-refused"] == "not_json"
            _clean(json.dumps(message.headers))
            message.ack()
        assert (client.llen("fuzzq"), client.hlen("unacked")) == (0, 0)
    finally:
        client.close()


def test_a_held_record_kombu_cannot_decode_goes_back_to_its_queue(redis_url: str) -> None:
    """A message taken and never acked (its worker died) is put back by the restore, which read
    the record with kombu and caught only ValueError and TypeError: decimal's error escaped."""
    from kombu import Connection

    from worker._guard import GuardedRedisTransport

    entry = _KOMBU_UNREADABLE["decimal-property"]
    client = redis.Redis.from_url(redis_url)
    try:
        with Connection(redis_url, transport=GuardedRedisTransport) as connection:
            connection.SimpleQueue("fuzzq")  # (declared: the restore finds the queue bound)
            client.hset("unacked", "held-1", b"[" + entry + b', "", "fuzzq"]')
            client.zadd("unacked_index", {"held-1": 1.0})
            connection.default_channel.qos.restore_by_tag("held-1")
        assert client.lrange("fuzzq", 0, -1) == [entry]
        assert client.hlen("unacked") == 0
    finally:
        client.close()


@pytest.mark.parametrize(
    "body",
    [{"method": "ping", "arguments": {}, "x": {"__type__": "uuid", "__value__": MARKER}},
     {"method": "ping", "arguments": {"__type__": "decimal", "__value__": MARKER}}],
    ids=["uuid", "decimal"],
)  # fmt: skip
def test_a_broadcast_kombu_cannot_decode_is_refused(body: dict[str, Any]) -> None:
    """kombu's pidbox decodes the body with its own JSON reader: what it cannot decode was passed
    (it then raised in the consumer, or logged the whole message)."""
    from worker._guard import screen_broadcast

    envelope = {
        "body": base64.b64encode(json.dumps(body).encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"clock": 1},
        "properties": {"delivery_info": {"exchange": "celery.pidbox", "routing_key": ""}, "priority": 0,
                       "body_encoding": "base64", "delivery_tag": str(uuid.uuid4())},
    }  # fmt: skip
    refusal = screen_broadcast(json.dumps(envelope).encode(), ENTRY_LIMIT, "celery.pidbox")
    assert refusal is not None
    assert refusal.reason == "not_json"
    # kombu's reader keeps an integer past 64 bits (orjson read it as a float, refused): a clock
    # that large, where a Lamport clock never gets, is refused as before.
    envelope["headers"]["clock"] = 2**70
    envelope["body"] = base64.b64encode(json.dumps({"method": "ping", "arguments": {}}).encode()).decode()
    refusal = screen_broadcast(json.dumps(envelope).encode(), ENTRY_LIMIT, "celery.pidbox")
    assert refusal is not None
    assert refusal.reason == "bad_body"


def test_a_batch_id_that_is_not_a_plain_id_is_refused_not_logged(runtime: _Runtime) -> None:
    """The task logs a batch's id (batch_done, message_dead_lettered): any text of the producer's,
    agent content included, went to the log as is. A plain id with a line break after it is not
    one either (a pattern ending in ``$`` took it: Celery's log line broke there)."""
    for batch_id in (f"{MARKER} {SECRET}\n", "b-1\n"):
        entry = json.dumps(_with_body(_valid_entry(), lambda batch, b=batch_id: batch.__setitem__("batch_id", b)))
        with structlog.testing.capture_logs() as logs:
            assert deliver(entry.encode(), runtime.it) == ("refused", "invalid_payload")
        _clean(repr(logs))
    assert not plain_id("b-1\n")


_UNKNOWN_FIELD = {
    "request": lambda batch, name: batch["requests"][0].__setitem__(name, 1),
    "span": lambda batch, name: batch["requests"][0]["spans"][0].__setitem__(name, 1),
    "event": lambda batch, name: batch["requests"][0]["spans"][0].__setitem__("events", [{"name": "e", name: 1}]),
}


@pytest.mark.parametrize("where", list(_UNKNOWN_FIELD))
def test_an_unknown_field_is_not_named_when_its_name_is_not_a_plain_name(runtime: _Runtime, where: str) -> None:
    """Validation names an unknown field by its name, which went into the task's dead letter and
    log line (``not a ScoreBatch: requests.0.<name>: Extra inputs are not permitted``): a name
    that is no plain one is shown as ``<field>``; a plain one is still named."""
    for name, shown in ((f"{MARKER} {SECRET}", "<field>"), ("bogus", "bogus")):
        entry = _with_body(_valid_entry(), lambda batch, name=name: _UNKNOWN_FIELD[where](batch, name))
        with structlog.testing.capture_logs() as logs:
            assert deliver(json.dumps(entry).encode(), runtime.it) == ("dead_letter", "invalid_payload")
        _clean(repr(logs))
        (letter, *_) = _letters(runtime.it)
        assert f".{shown}: " in letter.error, letter.error


def test_a_delivery_tag_of_any_text_is_not_kept_in_the_letter(runtime: _Runtime) -> None:
    """The letter's message key was ``msg:<delivery tag>``, a tag of the producer's choosing."""
    entry = _valid_entry()
    entry["content-type"] = "application/x-yaml"
    entry["properties"]["delivery_tag"] = f"{MARKER} {SECRET}"
    assert deliver(json.dumps(entry).encode(), runtime.it) == ("refused", "content_type_refused")


def _with_body(entry: dict[str, Any], change: Any) -> dict[str, Any]:
    body = json.loads(base64.b64decode(entry["body"]))
    change(body[0][0])
    # (ASCII escapes, as json.dumps and kombu's retries write them: a lone surrogate as \ud800)
    return {**entry, "body": base64.b64encode(json.dumps(body).encode()).decode()}


_LONE_SURROGATE = {
    # Not a ScoreBatch: its letter keeps the payload, which no store could write.
    "invalid": lambda batch: batch["requests"][0].__setitem__("spans", f"\ud800{MARKER}"),
    # A ScoreBatch: the scorer id in the store's keys could not be encoded (a retry each time).
    "scorer-id": lambda batch: batch["requests"][0].__setitem__("scorer_ids", ["length", "\udfff"]),
}


@pytest.mark.parametrize("change", list(_LONE_SURROGATE.values()), ids=list(_LONE_SURROGATE))
def test_a_body_with_a_lone_surrogate_is_refused(runtime: _Runtime, change: Any) -> None:
    """JSON escapes a lone surrogate (\\ud800) that is no character: neither a dead letter nor a
    score record holding it can be written (UTF-8), so the task's letter failed, its fallback
    letter failed too, and the message was requeued for ever, a second apart. Producers write
    U+FFFD in its place (``request_json``); such a body is refused as not UTF-8."""
    entry = _with_body(_valid_entry(), change)
    assert deliver(json.dumps(entry).encode(), runtime.it) == ("refused", "bad_encoding")


_KOMBU_TYPED = {
    # kombu decodes these in the pool's child, after the screen: bytes that are not UTF-8 in a
    # batch that does not validate made a letter no store could write (requeued for ever).
    "bytes-not-utf8": lambda batch: batch["requests"][0].__setitem__(
        "spans", {"__type__": "base64", "__value__": "/w=="}
    ),
    "uuid": lambda batch: batch["requests"][0]["spans"][0]["attributes"].__setitem__(
        "x", {"__type__": "uuid", "__value__": MARKER}
    ),
    "decimal": lambda batch: batch["requests"][0].__setitem__(
        "enqueued_at", {"__type__": "decimal", "__value__": "NaN"}
    ),
}


@pytest.mark.parametrize("change", list(_KOMBU_TYPED.values()), ids=list(_KOMBU_TYPED))
def test_a_body_with_a_kombu_typed_object_is_refused(runtime: _Runtime, change: Any) -> None:
    """The pool's child reads the body with kombu's JSON reader, which decodes an object of exactly
    ``__type__`` and ``__value__`` into a value (bytes, a UUID, a Decimal) or fails; the screen
    read it as plain JSON and passed it. No producer sends one: refused as the screen sees it."""
    entry = _with_body(_valid_entry(), change)
    assert deliver(json.dumps(entry).encode(), runtime.it) == ("refused", "bad_body")


def test_a_kombu_typed_object_whose_key_is_escaped_is_refused(runtime: _Runtime) -> None:
    """The screen looked for the text ``"__type__"`` before it walked the body; kombu's reader
    decodes the key written with escapes all the same (``"\\u005f_type__"``: bytes as a batch id,
    which ScoreBatch then took as text). Read as kombu reads it: refused."""
    entry = _valid_entry()
    body = base64.b64decode(entry["body"]).decode()
    typed = '{"\\u005f_type__": "bytes", "__value__": "b-1"}'
    body = body.replace('"batch_id":"b-1"', f'"batch_id":{typed}').replace('"batch_id": "b-1"', f'"batch_id": {typed}')
    assert typed in body
    entry["body"] = base64.b64encode(body.encode()).decode()
    assert deliver(json.dumps(entry).encode(), runtime.it) == ("refused", "bad_body")


@pytest.mark.parametrize("header", ["shadow", "id"])
def test_a_task_name_or_id_header_of_any_text_is_refused(runtime: _Runtime, header: str) -> None:
    """Celery logs each task as ``Task <shadow or name>[<id>] received`` and the task logs its id:
    a shadow name or an id of any text (a string was all the screen asked of them) went to the
    log as is. tracescore's producers send no shadow, and UUIDs for ids."""
    entry = _valid_entry()
    entry["headers"][header] = f"{MARKER} {SECRET}"
    assert deliver(json.dumps(entry).encode(), runtime.it) == ("refused", "bad_headers")


def test_a_real_worker_dead_letters_the_nastiest_entries_and_scores_the_rest(redis_url: str, tmp_path: Path) -> None:
    """End to end, a ``celery -A worker worker`` process on the fuzzed entries that used to get
    past the screen: each is one dead letter with its reason, the worker stays up, every valid
    batch around them is scored, and no log line carries the planted content."""
    from tests.worker._batches import payload
    from tests.worker._workers import WorkerProcess, read_scores, wait_for

    odd_field = _valid_entry()
    body = json.loads(base64.b64decode(odd_field["body"]))
    body[0][0]["requests"][0]["spans"][0][f"{MARKER} {SECRET}"] = 1
    odd_field["body"] = base64.b64encode(json.dumps(body).encode()).decode()
    bad = [
        *(("not_json", entry) for entry in _KOMBU_UNREADABLE.values()),
        (
            "invalid_payload",
            json.dumps(
                _with_body(_valid_entry(), lambda batch: batch.__setitem__("batch_id", f"{MARKER} {SECRET}"))
            ).encode(),
        ),
        ("invalid_payload", json.dumps(odd_field).encode()),
    ]
    for change in _LONE_SURROGATE.values():
        bad.append(("bad_encoding", json.dumps(_with_body(_valid_entry(), change)).encode()))
    for change in _KOMBU_TYPED.values():
        bad.append(("bad_body", json.dumps(_with_body(_valid_entry(), change)).encode()))
    for header in ("shadow", "id"):
        entry = _valid_entry()
        entry["headers"][header] = f"{MARKER} {SECRET}"  # (Celery's "Task <shadow>[<id>] received")
        bad.append(("bad_headers", json.dumps(entry).encode()))
    good = [payload(range(3 * i, 3 * i + 3), ["length"], salt="fuzz-e2e") for i in range(len(bad) + 1)]
    client = redis.Redis.from_url(redis_url)
    worker = WorkerProcess("fuzz", redis_url, tmp_path, scores_path=tmp_path / "scores.jsonl")
    try:
        worker.wait_ready()
        for i, batch in enumerate(good):
            message = task_message(ScoreBatch.model_validate(batch), "test")
            client.lpush(QUEUE, json.dumps(kombu_entry(message.body.encode(), message.headers, message.task_id)))
            if i < len(bad):
                client.lpush(QUEUE, bad[i][1])
        assert wait_for(lambda: len(read_scores(tmp_path / "scores.jsonl")) == 3 * len(good), 90), worker.text()[-3000:]
        assert wait_for(lambda: client.llen("tracescore:dlq") == len(bad), 30), worker.text()[-3000:]
        letters = [DeadLetter.model_validate_json(raw) for raw in client.lrange("tracescore:dlq", 0, -1)]
        assert sorted(d.reason for d in letters) == sorted(reason for reason, _ in bad)
        for letter in letters:  # (the task's letter keeps the payload, for `dlq retry`: by design)
            _clean(letter.model_copy(update={"payload": None}).model_dump_json())
        assert worker.proc.poll() is None
        assert (client.llen(QUEUE), client.hlen("unacked")) == (0, 0)
        log = worker.text()
        _clean(log)
        assert "Traceback" not in log
    finally:
        worker.stop()
        client.close()


def _batch_payload() -> dict[str, Any]:
    request = spans_request([_span("2" * 32, 0, None, True)], ["0000000000000001"], ["length"])
    return json.loads(ScoreBatch.model_construct(batch_id="b-text", requests=[request]).model_dump_json())


def _logged_clean(logs: list[dict[str, Any]], records: list[Any]) -> None:
    """Neither structlog's events nor the stdlib's records (Celery's own lines) hold the text."""
    _clean(repr(logs))
    _clean("\n".join(r.getMessage() for r in records))


def test_an_error_out_of_scoring_is_logged_by_its_type_not_its_text(
    runtime: _Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """batch_retry and message_dead_lettered logged ``f"{type}: {exc}"``, and Celery's retry line
    the exception's repr: an error's text may quote the run (a step's, a store's error about a
    record). The type is logged (and where it was raised), the text is not; the letter, in the
    user's own store, keeps it. (Applied in process, each retry runs at once, then the last.)"""
    import logging

    async def fails(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"the step failed on {MARKER} {SECRET}")

    monkeypatch.setattr(_task, "score_batch", fails)
    with structlog.testing.capture_logs() as logs, caplog.at_level(logging.INFO):
        result = score_batch_task.apply(args=[_batch_payload()], task_id=str(uuid.uuid4()))
    assert result.state == "SUCCESS", (result.state, result.result)
    _logged_clean(logs, caplog.records)
    retried = [e for e in logs if e["event"] == "batch_retry"]
    assert len(retried) == runtime.it.settings.retry_budget, logs
    [dead] = [e for e in logs if e["event"] == "message_dead_lettered"]
    assert {e["error_type"] for e in [*retried, dead]} == {"RuntimeError"}, logs
    [letter, *_] = _letters(runtime.it)
    assert letter.reason == "retry_budget_exhausted"
    assert MARKER in letter.error


def test_a_failed_write_back_is_logged_by_its_type_not_its_text() -> None:
    """score_write_failed logged the writer's exception with its traceback (its text: a sink's
    error may quote the record it refused)."""

    class Refusing:
        def write(self, records: Any) -> None:
            raise ValueError(f"the sink refused {MARKER} {SECRET}")

    registry = load_registry("tests.worker.sample_scorers")
    deps = ScoringDeps(registry=registry, store=MemoryScoreStore(), writer=Refusing(), run_timeout_s=None)  # type: ignore[arg-type]
    batch = ScoreBatch.model_validate(_batch_payload())
    from worker._scoring import score_batch

    with structlog.testing.capture_logs() as logs:
        report = asyncio.run(score_batch(batch, deps))
    assert report.write_failed == 1
    _clean(repr(logs))
    [line] = [e for e in logs if e["event"] == "score_write_failed"]
    assert line["error_type"] == "ValueError", line
    assert "exc_info" not in line, line  # (the renderer writes the traceback, the text with it)


@pytest.mark.parametrize("valid", [True, False], ids=["scored", "dead-lettered"])
def test_a_batch_id_not_screened_is_logged_as_a_digest_unless_plain(runtime: _Runtime, valid: bool) -> None:
    """A message that reaches the task without the consumer's screen (applied in process: every
    message a worker takes off the queue, `dlq retry`'s and a split's too, is screened) may carry
    any text as its batch id: the task's lines (batch_done, message_dead_lettered) logged it as it
    came. A plain id is logged as is; any other as a digest, the same for every line about it."""
    shown = []
    for batch_id in (f"{MARKER} {SECRET}\n", "b-plain-1"):
        raw = {**_batch_payload(), "batch_id": batch_id}
        if not valid:
            raw["requests"] = 5
        with structlog.testing.capture_logs() as logs:
            result = score_batch_task.apply(args=[raw], task_id=str(uuid.uuid4()))
        assert result.state == "SUCCESS", (result.state, result.result)
        _clean(repr(logs))
        _clean(repr(result.result))  # (the task's result: Celery logs it, "Task ... succeeded in ...: {...}")
        [line] = [e for e in logs if e["event"] == ("batch_done" if valid else "message_dead_lettered")]
        shown.append(line["batch_id"])
    digest, plain = shown
    assert plain == "b-plain-1"
    assert digest.startswith("sha256:"), digest
    assert plain_id(digest), digest


def test_the_runs_of_a_split_batch_with_a_long_plain_id_pass_the_screen(
    runtime: _Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch whose delivery crashed is split, each run sent as ``<batch id>/<i>``: for an id of
    125-128 characters (plain, accepted) that is past the screen's 128, and every run's message
    was refused as invalid_payload, not retryable, instead of scored."""
    request = spans_request(
        [_span("3" * 32, 0, None, True), _span("3" * 32, 10, None, True)],
        ["0000000000000001", "000000000000000b"],
        ["length"],
    )
    batch = ScoreBatch.model_construct(batch_id="b" * 128, requests=[request])
    message = task_message(batch, "tracescore-exporter")
    sent: list[dict[str, Any]] = []

    async def crashed_once(task_id: str, token: str) -> int:
        return 1

    def publish(*, args: Any, task_id: str, queue: str, headers: dict[str, Any]) -> None:
        sent.append({"args": args, "task_id": task_id})

    monkeypatch.setattr(runtime.it.deliveries, "start", crashed_once)
    monkeypatch.setattr(score_batch_task, "apply_async", publish)
    result = score_batch_task.apply(args=json.loads(message.body)[0], task_id=message.task_id)
    assert result.state == "SUCCESS", (result.state, result.result)
    assert len(sent) == 2
    monkeypatch.undo()
    ids = set()
    for one in sent:
        part = ScoreBatch.model_validate(one["args"][0])
        sub = task_message(part, "tracescore-worker")
        entry = kombu_entry(sub.body.encode(), {**sub.headers, "id": one["task_id"]}, one["task_id"])
        assert deliver(json.dumps(entry).encode(), runtime.it) == ("scored", None)
        ids.add(part.batch_id)
    assert len(ids) == 2  # each run's message keeps an id of its own
