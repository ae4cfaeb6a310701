"""Cutting requests into messages by bytes and by (run, scorer id) pairs, for every producer
(issue 10: one big run must not make its neighbours' message too large; no message may ask the
workers for more than ``MAX_BATCH_PAIRS`` scores, which they refuse).

Each request is encoded once here; the JSON sizes it and then travels as is
(``task_message(requests_json=)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracing._errors import RunTooLarge
from tracing.queue._contract import MAX_BATCH_PAIRS, MAX_SCORER_IDS, ScoreRequest, encode_request, spans_request
from tracing.queue._limits import MESSAGE_ENVELOPE_BYTES
from tracing.queue._wire import wire_size

__all__ = ["Chunk", "RequestCutter", "RunTooLarge"]


@dataclass(slots=True)
class Chunk:
    """Requests that fit one message, with their JSON (same order), its size, and the runs and
    (run, scorer id) pairs they ask for."""

    requests: list[ScoreRequest] = field(default_factory=list)
    encoded: list[str] = field(default_factory=list)
    size: int = 0
    runs: int = 0
    pairs: int = 0


class RequestCutter:
    """Groups requests into chunks whose JSON fits ``max_payload_bytes`` (the workers'
    ``TRACESCORE_MAX_PAYLOAD_BYTES``) with the message envelope, and at most ``max_bytes`` of it
    when given (a softer bound of the caller's), each asking for at most ``max_pairs`` (run, scorer
    id) pairs (``MAX_BATCH_PAIRS``, which the workers refuse past). ``add`` returns the chunks it
    closed to make room, oldest first (none, or one: more only for a request split by pairs), or
    raises ``RunTooLarge`` for a request over the byte cap on its own (nothing is added; a caller
    splits one of several runs run by run). A request asking for more pairs than a message may is
    split by runs, in order, each part with its runs' own spans (``ScoreRequest.run_spans``), as
    many runs a part as fit. ``runs_text_replaced`` counts the runs added whose text had to be
    replaced to be written (``encode_request``)."""

    def __init__(
        self, max_payload_bytes: int, *, max_bytes: int | None = None, max_pairs: int = MAX_BATCH_PAIRS
    ) -> None:
        if max_payload_bytes <= MESSAGE_ENVELOPE_BYTES:
            raise ValueError(
                f"max_payload_bytes must be over {MESSAGE_ENVELOPE_BYTES} (the message envelope), got"
                f" {max_payload_bytes}: pass the workers' TRACESCORE_MAX_PAYLOAD_BYTES"
            )
        if not MAX_SCORER_IDS <= max_pairs <= MAX_BATCH_PAIRS:
            # (under MAX_SCORER_IDS, a run of a request's every scorer could fit no message)
            raise ValueError(f"max_pairs must be {MAX_SCORER_IDS}–{MAX_BATCH_PAIRS} (MAX_BATCH_PAIRS), got {max_pairs}")
        self.room = max_payload_bytes - MESSAGE_ENVELOPE_BYTES
        self.limit = self.room if max_bytes is None else min(self.room, max_bytes)
        self.max_pairs = max_pairs
        self.chunk = Chunk()
        self.runs_text_replaced = 0

    def add(self, request: ScoreRequest) -> list[Chunk]:
        parts = [request] if request.pairs() <= self.max_pairs else _split(request, self.max_pairs)
        # Every part encoded and sized before any is added: a part over the byte cap leaves the
        # chunk as it was (the caller splits the request run by run, or rejects its one run).
        ready = []
        for part in parts:
            encoded, replaced = encode_request(part)
            size = wire_size(encoded) + 1  # and the comma between requests
            if size - 1 > self.room:
                raise RunTooLarge(part, size - 1, self.room + MESSAGE_ENVELOPE_BYTES)
            ready.append((part, encoded, replaced, size))
        closed = []
        for part, encoded, replaced, size in ready:
            runs, pairs = len(part.target_span_ids), part.pairs()
            chunk = self.chunk
            if chunk.requests and (chunk.size + size > self.limit or chunk.pairs + pairs > self.max_pairs):
                closed.append(self.take())
                chunk = self.chunk
            chunk.requests.append(part)
            chunk.encoded.append(encoded)
            chunk.size += size
            chunk.runs += runs
            chunk.pairs += pairs
            if replaced:
                self.runs_text_replaced += runs
        return closed

    def take(self) -> Chunk:
        """The chunk so far (possibly empty); a new one starts."""
        chunk, self.chunk = self.chunk, Chunk()
        return chunk


def _split(request: ScoreRequest, max_pairs: int) -> list[ScoreRequest]:
    """``request``'s runs in order, as many a request as ``max_pairs`` allows, each part with its
    runs' own spans in the trace's order (a part of one run: that run's, as ``per_target``)."""
    scorers = len(set(request.scorer_ids))
    if scorers > max_pairs:
        raise ValueError(
            f"trace {request.trace_id}: {scorers} scorer ids, more than a message may ask a run for ({max_pairs})"
        )
    per_part = max_pairs // scorers
    targets = request.target_span_ids
    runs = request.run_spans()
    parts = []
    for start in range(0, len(targets), per_part):
        group = targets[start : start + per_part]
        if len(group) == 1:
            spans = runs[group[0]]
        else:
            members = {id(span) for target in group for span in runs[target]}
            spans = [span for span in request.spans if id(span) in members]
        parts.append(
            spans_request(
                spans, group, request.scorer_ids, request.enqueued_at, source=request.source, job_id=request.job_id
            )
        )
    return parts
