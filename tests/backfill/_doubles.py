"""Test doubles of the backfill driver's two boundaries: a submitter that keeps what it was
handed (the broker's stand-in) and a reporter that keeps its messages."""

from __future__ import annotations

from collections.abc import Generator, Sequence

from tests._redis import RedisServer
from tracing.queue import MESSAGE_ENVELOPE_BYTES, ScoreBatch, request_json
from worker._progress import ProgressReporter
from worker.backfill._state import RedisJobStore


class CapturingSubmitter:
    """A broker-like submitter that keeps each batch with the JSON it was handed. ``room``: the
    bytes of requests' JSON a message may hold (as the workers' cap); None, no cap (then no JSON
    is handed over)."""

    mode = "redis"

    def __init__(self, room: int | None = None) -> None:
        self.max_payload_bytes = room + MESSAGE_ENVELOPE_BYTES if room is not None else None
        self.sent: list[tuple[ScoreBatch, list[str] | None]] = []

    def submit(self, batch: ScoreBatch, requests_json: Sequence[str] | None = None) -> None:
        if self.max_payload_bytes is not None:
            # A capped submitter gets the JSON the driver measured, exactly the requests'.
            assert requests_json == [request_json(r) for r in batch.requests]
        self.sent.append((batch, list(requests_json) if requests_json is not None else None))

    @property
    def runs(self) -> list[tuple[str, str]]:
        """(trace id, target span id) of every run handed over, in order."""
        return [(r.trace_id, s) for batch, _ in self.sent for r in batch.requests for s in r.target_span_ids]

    def progress(self, job_id: str) -> dict[str, int]:
        return {}

    def pending(self) -> int:
        return 0

    def close(self) -> None:
        pass


class Messages(ProgressReporter):
    """A reporter that keeps the problems it was told, for a test to read."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        self.lines.append(text)


def redis_job_store(server: RedisServer, db: int) -> Generator[RedisJobStore]:
    """A job store on ``db`` of ``server``, emptied before and after (a fixture's body)."""
    client = server.client(db, decode_responses=True)
    client.flushdb()
    try:
        yield RedisJobStore(client)
    finally:
        client.flushdb()
        client.close()
