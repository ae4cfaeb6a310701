"""Cutting requests into messages by bytes, for every producer (issue 10: one big run must not
make its neighbours' message too large).

Each request is encoded once here; the JSON sizes it and then travels as is
(``task_message(requests_json=)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracing._errors import RunTooLarge
from tracing.queue._contract import ScoreRequest, encode_request
from tracing.queue._limits import MESSAGE_ENVELOPE_BYTES
from tracing.queue._wire import wire_size

__all__ = ["Chunk", "RequestCutter", "RunTooLarge"]


@dataclass(slots=True)
class Chunk:
    """Requests that fit one message, with their JSON (same order) and its size."""

    requests: list[ScoreRequest] = field(default_factory=list)
    encoded: list[str] = field(default_factory=list)
    size: int = 0


class RequestCutter:
    """Groups requests into chunks whose JSON fits ``max_payload_bytes`` (the workers'
    ``TRACESCORE_MAX_PAYLOAD_BYTES``) with the message envelope, and at most ``max_bytes`` of it
    when given (a softer bound of the caller's). ``add`` returns the chunk it closed to make room,
    if any, or raises ``RunTooLarge`` for a request over the cap on its own (nothing is added).
    ``runs_text_replaced`` counts the runs added whose text had to be replaced to be written
    (``encode_request``)."""

    def __init__(self, max_payload_bytes: int, *, max_bytes: int | None = None) -> None:
        if max_payload_bytes <= MESSAGE_ENVELOPE_BYTES:
            raise ValueError(
                f"max_payload_bytes must be over {MESSAGE_ENVELOPE_BYTES} (the message envelope), got"
                f" {max_payload_bytes}: pass the workers' TRACESCORE_MAX_PAYLOAD_BYTES"
            )
        self.room = max_payload_bytes - MESSAGE_ENVELOPE_BYTES
        self.limit = self.room if max_bytes is None else min(self.room, max_bytes)
        self.chunk = Chunk()
        self.runs_text_replaced = 0

    def add(self, request: ScoreRequest) -> Chunk | None:
        encoded, replaced = encode_request(request)
        size = wire_size(encoded) + 1  # and the comma between requests
        if size - 1 > self.room:
            raise RunTooLarge(request, size - 1, self.room + MESSAGE_ENVELOPE_BYTES)
        closed = None
        if self.chunk.requests and self.chunk.size + size > self.limit:
            closed = self.take()
        chunk = self.chunk
        chunk.requests.append(request)
        chunk.encoded.append(encoded)
        chunk.size += size
        if replaced:
            self.runs_text_replaced += len(request.target_span_ids)
        return closed

    def take(self) -> Chunk:
        """The chunk so far (possibly empty); a new one starts."""
        chunk, self.chunk = self.chunk, Chunk()
        return chunk
