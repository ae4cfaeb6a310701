"""A broker connection left half-open by a failover: the worker notices and consumes again.

A Redis failover (Sentinel, a managed Redis, a Kubernetes Service) moves the endpoint to a new
primary while the worker's connections to the old one are left half-open: the old node gone
without a reset, or frozen. Nothing on such a connection ever fails: a written command is
acknowledged by the kernel (here: by the proxy, which reads and discards) and no reply comes,
so no TCP timeout ends it either. The worker must still find the new primary within a bounded
time, and score what was sent there.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from pathlib import Path

import pytest

from tests._redis import RedisServer
from tests.worker._batches import batch, send
from tests.worker._workers import WorkerProcess, read_scores, wait_for
from tracing._score_record import score_id_for
from worker.store import RedisOutbox


class FailoverProxy:
    """A TCP proxy to one Redis; ``fail_over`` black-holes every connection it holds (read and
    discarded, never answered, never closed) and sends new connections to another port;
    ``hold_replies`` keeps Redis' replies from the worker (its commands still reach Redis, as on a
    Redis that stalls after applying them) until ``release_replies``."""

    def __init__(self, upstream_port: int) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._upstream_port = upstream_port
        self._peer: dict[socket.socket, socket.socket] = {}  # both directions of each live pair
        self._clients: set[socket.socket] = set()  # the worker's side of each live pair
        self._holes: set[socket.socket] = set()  # the worker's side of each black-holed pair
        self._holding = False
        self._held: dict[socket.socket, bytearray] = {}  # replies kept from each worker socket
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def fail_over(self, upstream_port: int) -> None:
        with self._lock:
            self._upstream_port = upstream_port
            for client in list(self._clients):
                upstream = self._peer.pop(client)
                self._peer.pop(upstream, None)
                upstream.close()  # (the old primary is gone; the worker is not told)
                self._clients.discard(client)
                self._holes.add(client)

    def hold_replies(self) -> None:
        with self._lock:
            self._holding = True

    def release_replies(self) -> None:
        with self._lock:
            self._holding = False
            for client, data in self._held.items():
                if client in self._clients:
                    with contextlib.suppress(OSError):
                        client.sendall(data)
            self._held.clear()

    def _run(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                watched = [self._server, *self._peer, *self._holes]
            try:
                readable, _, _ = select.select(watched, [], [], 0.05)
            except (OSError, ValueError):
                continue  # a socket closed meanwhile
            for sock in readable:
                if sock is self._server:
                    self._accept()
                    continue
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                with self._lock:
                    if sock in self._holes:
                        if not data:
                            self._holes.discard(sock)
                            sock.close()
                        continue  # read and discarded: never answered
                    peer = self._peer.get(sock)
                    if peer is None:
                        continue
                    if data and self._holding and peer in self._clients:
                        self._held.setdefault(peer, bytearray()).extend(data)
                        continue
                    if data:
                        try:
                            peer.sendall(data)
                            continue
                        except OSError:
                            pass
                    for s in (sock, peer):
                        self._held.pop(s, None)
                        self._peer.pop(s, None)
                        self._clients.discard(s)
                        s.close()

    def _accept(self) -> None:
        client, _ = self._server.accept()
        with self._lock:  # (held while connecting: a connection made as it fails over is not missed)
            try:
                upstream = socket.create_connection(("127.0.0.1", self._upstream_port), timeout=5)
            except OSError:
                client.close()
                return
            upstream.settimeout(None)
            self._peer[client], self._peer[upstream] = upstream, client
            self._clients.add(client)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        self._server.close()
        with self._lock:
            for sock in [*self._peer, *self._holes]:
                sock.close()
            self._peer.clear()
            self._holes.clear()


@pytest.mark.parametrize("when", ["idle", "mid_task"])
def test_a_worker_on_a_half_open_broker_connection_consumes_from_the_new_primary(when: str, tmp_path: Path) -> None:
    """A worker consuming through a proxy from Redis A; the proxy then fails over: the worker's
    connections are black-holed (never answered, never closed) and new ones reach Redis B (same
    password). ``idle``: after the first batch was done; ``mid_task``: while it is being scored,
    so its ack goes to a dead connection. A batch sent to B is scored there, within a bounded
    time; nothing is scored twice, the worker stays up, and its output never shows the password.
    Before: the worker waited on the dead connection forever (the unacked sweep's script, or the
    ack), and logged nothing."""
    primary, replacement = RedisServer(), RedisServer()
    replacement.password = primary.password
    primary.start()
    replacement.start()
    proxy = FailoverProxy(primary.port)
    url = f"redis://:{primary.password}@127.0.0.1:{proxy.port}/0"
    scores_path = tmp_path / "scores.jsonl"
    worker: WorkerProcess | None = None
    outboxes: list[RedisOutbox] = []
    try:
        worker = WorkerProcess(f"half-open-{when}", url, tmp_path, scores_path=scores_path, env={"TSTEST_SLOW_S": "3"})
        worker.wait_ready()
        running = worker

        def scored(server: RedisServer, ids: list[str]) -> bool:
            outbox = RedisOutbox(server.url(0))
            outboxes.append(outbox)
            return wait_for(lambda: len(outbox.records(ids)) == len(ids) or running.proc.poll() is not None, 90)

        scorer = "length" if when == "idle" else "slow"
        first = batch(range(3), [scorer], salt=f"half-open-a-{when}", batch_id="half-open-a")
        send(primary.url(0), first)
        first_ids = [score_id_for(r.trace_id, t, scorer, "1") for r in first.requests for t in r.target_span_ids]
        if when == "idle":
            assert scored(primary, first_ids), worker.text()[-3000:]
            assert wait_for(lambda: " succeeded in " in running.text(), 30), worker.text()[-3000:]
        else:
            assert wait_for(lambda: " received" in running.text(), 30), worker.text()[-3000:]

        proxy.fail_over(replacement.port)
        second = batch(range(3, 6), ["length"], salt=f"half-open-b-{when}", batch_id="half-open-b")
        send(replacement.url(0), second)
        second_ids = [score_id_for(r.trace_id, t, "length", "1") for r in second.requests for t in r.target_span_ids]
        assert scored(replacement, second_ids), f"not scored on the new primary:\n{worker.text()[-4000:]}"
        assert worker.proc.poll() is None, worker.text()[-3000:]

        expected = set(first_ids) | set(second_ids)
        assert wait_for(lambda: expected <= {s["score_id"] for s in read_scores(scores_path)}, 30), worker.text()[
            -3000:
        ]
        ids = [s["score_id"] for s in read_scores(scores_path)]
        assert len(ids) == len(set(ids)), "a score was written twice"
        assert set(ids) == expected
        assert primary.password not in worker.text()
    finally:
        if worker is not None:
            worker.stop()
        for outbox in outboxes:
            outbox.close()
        proxy.close()
        primary.close()
        replacement.close()


def test_an_ack_applied_whose_answer_never_came_scores_nothing_twice_and_says_so(tmp_path: Path) -> None:
    """Redis applies a batch's ack but its answer does not come within the broker's 10 s command
    timeout (a Redis that stalls after the write, a reply lost on the way): the worker goes on,
    the message is gone for good (no redelivery, nothing scored twice), and its warning does not
    claim the message stayed in the unacked record for the sweep (``message_left_unacked``),
    which the operator would then wait for or put back by hand: the ack's outcome is unknown
    (``message_outcome_unknown``)."""
    server = RedisServer()
    server.start()
    proxy = FailoverProxy(server.port)
    url = f"redis://:{server.password}@127.0.0.1:{proxy.port}/0"
    scores_path = tmp_path / "scores.jsonl"
    worker: WorkerProcess | None = None
    outbox = RedisOutbox(server.url(0))
    client = server.client(0)
    try:
        worker = WorkerProcess(
            "ack-unanswered",
            url,
            tmp_path,
            scores_path=scores_path,
            # the score store straight to Redis: only the broker's answers are held
            env={"TSTEST_SLOW_S": "3", "TRACESCORE_REDIS_URL": server.url(0)},
        )
        worker.wait_ready()
        running = worker
        first = batch(range(3), ["slow"], salt="ack-unanswered-a", batch_id="ack-unanswered-a")
        send(server.url(0), first)
        first_ids = [score_id_for(r.trace_id, t, "slow", "1") for r in first.requests for t in r.target_span_ids]
        assert wait_for(lambda: " received" in running.text(), 30), worker.text()[-3000:]
        proxy.hold_replies()  # (while the batch scores: its ack is the next broker write)
        assert wait_for(lambda: len(outbox.records(first_ids)) == 3, 30), worker.text()[-3000:]
        assert wait_for(lambda: not client.exists("unacked") and client.llen("tracescore") == 0, 30), (
            "the ack never reached Redis"
        )
        assert wait_for(lambda: "Couldn't ack" in running.text() or "after=ack" in running.text(), 40), worker.text()[
            -3000:
        ]
        proxy.release_replies()

        second = batch(range(3, 6), ["length"], salt="ack-unanswered-b", batch_id="ack-unanswered-b")
        send(server.url(0), second)
        second_ids = [score_id_for(r.trace_id, t, "length", "1") for r in second.requests for t in r.target_span_ids]
        assert wait_for(lambda: len(outbox.records(second_ids)) == 3, 90), worker.text()[-4000:]
        expected = set(first_ids) | set(second_ids)
        assert wait_for(lambda: expected <= {s["score_id"] for s in read_scores(scores_path)}, 30), worker.text()[
            -3000:
        ]
        assert worker.proc.poll() is None, worker.text()[-3000:]
        ids = [s["score_id"] for s in read_scores(scores_path)]
        assert len(ids) == len(set(ids)), "a score was written twice"
        assert set(ids) == expected
        assert int(client.get("tstest:calls:slow:generate_score") or 0) == 3  # each run scored once
        assert not client.exists("unacked")
        assert client.llen("tracescore") == 0
        text = worker.text()
        ack_lines = [line for line in text.splitlines() if "after=ack" in line]
        assert ack_lines, text[-3000:]
        assert not any("message_left_unacked" in line for line in ack_lines), ack_lines
        assert all("message_outcome_unknown" in line for line in ack_lines), ack_lines
        assert server.password not in text
    finally:
        if worker is not None:
            worker.stop()
        outbox.close()
        client.close()
        proxy.close()
        server.close()
