"""CelerySink against this session's Redis (password, own port): messages, and a broker that goes away."""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.trace import set_span_in_context

from tests._forked import in_forked_child
from tests._redis import RedisServer
from tests.tracing._exporting import FakeClock, read, wait_for
from tests.tracing._spans import Recorder, agent_trace
from tests.worker._batches import batch as make_batch
from tracing import SCORE_TASK_NAME, CelerySink, ScoreBatch, ScoringRule, ScoringSpanExporter

QUEUE = "tracescore-sink-test"
DB = 3

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the redis-server binary")


@pytest.fixture
def own_redis(redis_server: RedisServer) -> Iterator[RedisServer]:
    """The session's Redis (own port and password), DB 3 emptied; started again if a test stopped it."""
    redis_server.client(DB).flushdb()
    try:
        yield redis_server
    finally:
        if redis_server.proc is None:
            redis_server.start()


def _messages(server: RedisServer) -> list[dict[str, Any]]:
    """The Celery messages waiting in the queue's Redis list, oldest first."""
    raw = server.client(DB).lrange(QUEUE, 0, -1)
    return [json.loads(m) for m in reversed(raw)]  # kombu LPUSHes, workers BRPOP


def _batch(message: dict[str, Any]) -> ScoreBatch:
    assert message["headers"]["task"] == SCORE_TASK_NAME
    assert message["content-type"] == "application/json"
    body = message["body"]
    if message["properties"].get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args, kwargs, _embed = json.loads(body)
    assert kwargs == {}
    return ScoreBatch.model_validate(args[0])


def test_message_is_a_celery_task(own_redis: RedisServer) -> None:
    """A sent batch is a JSON Celery protocol-2 message for tracescore.score_batch."""
    clock = FakeClock()
    exp = ScoringSpanExporter([ScoringRule(["helpfulness"])], CelerySink(own_redis.url(DB), queue=QUEUE), clock=clock)
    try:
        rec = Recorder()
        trace_id = agent_trace(rec, question="Where is my order?")
        exp.export(rec.spans())
        assert exp.force_flush(10_000)
        messages = _messages(own_redis)
        assert len(messages) == 1
        batch = _batch(messages[0])
        assert batch.requests[0].scorer_ids == ["helpfulness"]
        assert batch.requests[0].trace_id == trace_id
        assert read(batch.requests[0]).input.input_messages[0].text == "Where is my order?"
    finally:
        exp.shutdown(5000)


def test_broker_down_then_back(own_redis: RedisServer) -> None:
    """Redis stops while spans flow: nothing raises, the app goes on, and the runs arrive later."""
    clock = FakeClock()
    sink = CelerySink(own_redis.url(DB), queue=QUEUE, connect_timeout_s=0.5, publish_timeout_s=0.5)
    exp = ScoringSpanExporter([ScoringRule(["s"])], sink, retry_initial_s=0.05, retry_max_s=0.3, clock=clock)
    try:
        first = Recorder()
        ids = [agent_trace(first, question="before")]
        exp.export(first.spans())
        assert exp.force_flush(10_000)
        assert len(_messages(own_redis)) == 1

        own_redis.stop()
        for i in range(3):
            rec = Recorder()
            ids.append(agent_trace(rec, question=f"during {i}"))
            assert exp.export(rec.spans()).name == "SUCCESS"
        clock.advance(10)
        exp.tick()  # completes the three traces and hands them to the (failing) sender
        assert wait_for(lambda: exp.stats()["send_failures"] >= 2, 20)
        assert exp.stats()["runs_sent"] == 1
        assert exp.force_flush(100) is False  # still pending, and force_flush kept its deadline

        own_redis.start()  # same port, empty (no persistence): only the buffered runs can arrive
        assert wait_for(lambda: exp.stats()["runs_sent"] == 4, 30)
        arrived = [r for m in _messages(own_redis) for r in _batch(m).requests]
        assert sorted(r.trace_id for r in arrived) == sorted(ids[1:])
        assert exp.stats()["dropped"] == {}
    finally:
        exp.shutdown(5000)


def test_down_broker_fails_fast() -> None:
    """With no broker listening a send raises within the connect timeout instead of hanging."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sink = CelerySink(f"redis://127.0.0.1:{port}/{DB}", queue=QUEUE, connect_timeout_s=0.5)
    batch = make_batch(range(1), ["s"], batch_id="b1")
    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 - any broker error: the exporter retries them all
        sink.send(batch)
    assert time.monotonic() - started < 5


def test_failed_connect_releases_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """A send whose connect fails releases the kombu connection it opened instead of leaking it."""
    import kombu

    released: list[object] = []
    real_release = kombu.Connection.release

    def release(self: kombu.Connection) -> None:
        released.append(self)
        real_release(self)

    monkeypatch.setattr(kombu.Connection, "release", release)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sink = CelerySink(f"redis://127.0.0.1:{port}/{DB}", queue=QUEUE, connect_timeout_s=0.5)
    batch = make_batch(range(1), ["s"], batch_id="b1")
    with pytest.raises(Exception):  # noqa: B017 - any broker error
        sink.send(batch)
    assert len(released) == 1


def test_no_late_batch_after_shutdown_and_close(own_redis: RedisServer) -> None:
    """Broker down at shutdown: the runs are dropped and counted, and none arrives once it is back."""
    clock = FakeClock()
    sink = CelerySink(own_redis.url(DB), queue=QUEUE, connect_timeout_s=0.3, publish_timeout_s=0.3)
    exp = ScoringSpanExporter(
        [ScoringRule(["s"])], sink, batch_size=1, retry_initial_s=0.05, retry_max_s=0.1, clock=clock
    )
    own_redis.stop()
    for i in range(5):
        rec = Recorder()
        agent_trace(rec, question=f"late {i}")
        exp.export(rec.spans())
    exp.tick()
    clock.advance(10)
    exp.tick()
    assert wait_for(lambda: exp.stats()["send_failures"] >= 1, 20)
    exp.shutdown(300)
    sink.close()  # what the application does next; closing again is harmless
    assert exp.stats()["dropped"] == {"shutdown_unsent": 5}
    assert not exp._sender.is_alive()  # the only thread that sends is gone
    own_redis.start()  # same port, empty: anything that arrives now was sent after shutdown
    with pytest.raises(RuntimeError, match="closed"):
        sink.send(ScoreBatch.model_construct(batch_id="late", requests=[]))
    assert _messages(own_redis) == []


def test_a_misplaced_queue_key_is_named_retried_and_nothing_lost(own_redis: RedisServer) -> None:
    """The queue's key holds a string (an operator's key): each send fails with QueueKeyError
    naming it, the exporter logs that text (never Redis's own, which quotes the message) and
    keeps the runs; once the key is moved aside they all arrive, none twice."""
    import structlog.testing

    from tracing.queue import QueueKeyError

    client = own_redis.client(DB)
    client.set(QUEUE, "an operator's note")
    sink = CelerySink(own_redis.url(DB), queue=QUEUE, connect_timeout_s=0.5, publish_timeout_s=0.5)
    with pytest.raises(QueueKeyError) as refused:
        sink.send(make_batch(range(1), ["s"], batch_id="b0"))
    assert (refused.value.key, refused.value.found, refused.value.expected) == (QUEUE, "string", "list")
    assert refused.value.category == "config"
    assert "LPUSH" not in str(refused.value)
    assert "Command" not in str(refused.value)

    clock = FakeClock()
    exp = ScoringSpanExporter([ScoringRule(["s"])], sink, retry_initial_s=0.05, retry_max_s=0.2, clock=clock)
    try:
        ids = []
        with structlog.testing.capture_logs() as logs:
            for i in range(3):
                rec = Recorder()
                ids.append(agent_trace(rec, question=f"private question {i}"))
                exp.export(rec.spans())
            clock.advance(10)
            exp.tick()
            assert wait_for(lambda: exp.stats()["send_failures"] >= 2, 20)
        failed = [e for e in logs if e["event"] == "sink_send_failed"]
        assert failed
        assert f"Redis key '{QUEUE}' on the broker holds a string" in failed[0]["error"]
        assert not any("private question" in str(e) for e in logs)
        assert exp.stats()["runs_sent"] == 0
        assert exp.stats()["dropped"] == {}

        client.rename(QUEUE, f"{QUEUE}-aside")
        assert wait_for(lambda: exp.stats()["runs_sent"] == 3, 30)
        arrived = [r.trace_id for m in _messages(own_redis) for r in _batch(m).requests]
        assert sorted(arrived) == sorted(ids)
        assert exp.stats()["dropped"] == {}
    finally:
        exp.shutdown(5000)


def test_kombus_binding_set_of_another_type_is_named_with_its_own_remedy(own_redis: RedisServer) -> None:
    """kombu's binding set for the queue holding a string: the send names that key and says to
    delete it (it holds no message; a starting worker rebuilds it), not to rename it aside."""
    from tracing.queue import QueueKeyError

    client = own_redis.client(DB)
    client.set(f"_kombu.binding.{QUEUE}", "stale")
    sink = CelerySink(own_redis.url(DB), queue=QUEUE, connect_timeout_s=0.5, publish_timeout_s=0.5)
    try:
        with pytest.raises(QueueKeyError, match="holds no message: delete it") as refused:
            sink.send(make_batch(range(1), ["s"], batch_id="b0"))
        assert (refused.value.key, refused.value.found) == (f"_kombu.binding.{QUEUE}", "string")
        client.delete(f"_kombu.binding.{QUEUE}")
        sink.send(make_batch(range(1), ["s"], batch_id="b1"))
        assert [_batch(m).batch_id for m in _messages(own_redis)] == ["b1"]
    finally:
        sink.close()


def test_a_forked_child_sends_its_own_traces_and_the_parents_once(own_redis: RedisServer) -> None:
    """An app that forks after setting up tracing (gunicorn --preload, multiprocessing): the child
    sends its traces through its own threads and its own broker connection, with counts of its
    own, and a trace open in the parent at the fork is sent once, by the parent. Before, the
    child had no flusher or sender: its traces were never sent, and its shutdown waited out the
    deadline to count them as unsent."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from tests.tracing._spans import chat_attributes

    exporter = ScoringSpanExporter(
        [ScoringRule(["helpfulness"])],
        CelerySink(own_redis.url(DB), queue=QUEUE),
        grace_s=0.2,
        processor_delay_s=0.1,
        flush_interval_s=0.1,
    )
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=100))
    tracer = provider.get_tracer("app")
    agent = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}

    def one_trace() -> str:
        with tracer.start_as_current_span("invoke_agent a", attributes=agent) as root:
            with tracer.start_as_current_span("chat m", attributes=chat_attributes("Hi?", "Hello.")):
                pass
            return format(root.get_span_context().trace_id, "032x")

    def sent() -> list[str]:
        return [r.trace_id for m in _messages(own_redis) for r in _batch(m).requests]

    before = one_trace()
    assert wait_for(lambda: sent() == [before], 10)
    # Open in the parent at the fork, its LLM call already filed in the buffer.
    open_root = tracer.start_span("invoke_agent a", attributes=agent)
    with tracer.start_as_current_span(
        "chat m", context=set_span_in_context(open_root), attributes=chat_attributes("Hi?", "Hello.")
    ):
        pass
    assert wait_for(lambda: exporter.stats()["traces_buffered"] == 1, 10)

    def in_the_child() -> dict[str, Any]:
        ids = [one_trace() for _ in range(3)]
        arrived = wait_for(lambda: set(ids) <= set(sent()), 10)
        provider.shutdown()
        stats = exporter.stats()
        return {"ids": ids, "arrived": arrived, "sent": stats["runs_sent"], "dropped": stats["dropped"]}

    try:
        child, status = in_forked_child(in_the_child)
        assert status == 0
        assert child["arrived"] is True
        assert (child["sent"], child["dropped"]) == (3, {})
        open_root.end()
        parent_trace = format(open_root.get_span_context().trace_id, "032x")
        assert wait_for(lambda: parent_trace in sent(), 10)
        assert exporter.force_flush(10_000)
        assert sorted(sent()) == sorted([before, parent_trace, *child["ids"]])
        assert exporter.stats()["runs_sent"] == 2
    finally:
        provider.shutdown()


class _SlowReplies:
    """A loopback TCP proxy to Redis whose every reply reaches the client ``delay_s`` late: a
    broker that answers each command, slowly (each reply inside the client's socket timeout)."""

    def __init__(self, target_port: int, delay_s: float) -> None:
        import threading

        self.delay_s = delay_s
        self.target_port = target_port
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        import threading

        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, 0.0), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self.delay_s), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, delay_s: float) -> None:
        try:
            while data := source.recv(65536):
                if delay_s:
                    time.sleep(delay_s)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._stop.set()
        self._server.close()
        self._accepting.join(5)
        for sock in self._sockets:
            sock.close()


def test_close_waits_for_a_send_under_way_at_most_its_timeouts(own_redis: RedisServer) -> None:
    """A broker answering each command 0.5 s late, inside the 1 s socket timeout: a fresh
    send's connect, declaration and publish take about eight round trips (4 s), and
    close() waited on it all (an app's exit took 12-21 s where the README promised shutdown_timeout_s
    plus one attempt). close() now waits at most one connect plus one socket timeout; the send
    goes on, lands, and its connection is released when it ends."""
    import threading

    proxy = _SlowReplies(own_redis.port, delay_s=0.5)
    url = f"redis://:{own_redis.password}@127.0.0.1:{proxy.port}/{DB}"
    sink = CelerySink(url, queue=QUEUE, connect_timeout_s=1.0, publish_timeout_s=1.0)
    sent = threading.Event()
    sending = threading.Thread(target=lambda: (sink.send(make_batch(range(1), ["s"], batch_id="slow")), sent.set()))
    try:
        sending.start()
        assert wait_for(lambda: sink.publisher._conn is not None, 10)  # the attempt is under way
        sink.close()
        assert sending.is_alive()  # close returned while the send was still under way
        assert not sent.is_set()
        sending.join(30)
        assert sent.is_set()  # it landed
        assert [_batch(m).batch_id for m in _messages(own_redis)] == ["slow"]
        assert sink.publisher._conn is None  # and released its connection as it ended
        with pytest.raises(RuntimeError, match="closed"):
            sink.send(make_batch(range(1), ["s"], batch_id="late"))
    finally:
        proxy.close()


def test_a_password_given_as_a_query_parameter_is_refused_at_construction() -> None:
    """kombu cannot read it: every send failed with "TypeError: dict() got multiple values for
    keyword argument 'password'", and every run was dropped as send_failed (log audit). The
    sink is not built; the error says where the password goes, and does not quote it."""
    with pytest.raises(ValueError, match="carries the password as a query parameter") as refused:
        CelerySink("redis://127.0.0.1:6379/0?password=pw-0123456789")
    assert "redis://:PASSWORD@host:6379/0" in str(refused.value)
    assert "0123456789" not in str(refused.value)
