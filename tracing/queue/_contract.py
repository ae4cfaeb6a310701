"""The one request shape: a trace's span records, the spans to score among them, the scorers.

The producer side (the exporter, backfill) builds it from span records, one request per trace
(and scorer set) however many runs the trace holds: the spans travel once, with every run's
target in ``target_span_ids``. The worker validates it and reads each run itself
(``trace_to_run(run_spans()[target], target)``), whatever the source: reading (JSON parsing,
validation) costs the worker CPU, never the instrumented application's nor the backfill's.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Set as AbstractSet
from typing import Annotated, Any, Literal, TypeVar

import structlog
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticSerializationError

from tracing._formats import agent_name, classify
from tracing._run import SPAN_ID_PATTERN, SpanRecord
from tracing._span import RecordView
from tracing._text import valid_text, without_lone_surrogates
from tracing.queue._json import dumps_or

__all__ = [
    "MAX_BATCH_PAIRS",
    "MAX_SCORER_IDS",
    "PLAIN_ID_PATTERN",
    "PLAIN_ID_RULE",
    "SCORE_TASK_NAME",
    "ScoreBatch",
    "ScoreRequest",
    "encode_request",
    "plain_id",
    "request_json",
    "spans_request",
]

log = structlog.get_logger("tracescore.queue")

# The Celery task name producers send to; the worker registers its task under this name.
SCORE_TASK_NAME = "tracescore.score_batch"
# What ``plain_id`` accepts, written once for the regular expression and for the sentences
# that say it (the producer's error, the workers' refusals).
_PLAIN_ID_MARKS = "_.:@/+=-"
_PLAIN_ID_MAX = 128
# As a regular expression to match whole (unanchored, so that a larger pattern can hold it: the
# workers' screen reads back its own sentences that show a plain id).
PLAIN_ID_PATTERN = rf"[A-Za-z0-9{re.escape(_PLAIN_ID_MARKS)}]{{1,{_PLAIN_ID_MAX}}}"
# As words, for an error's sentence.
PLAIN_ID_RULE = f"1–{_PLAIN_ID_MAX} ASCII letters, digits and {_PLAIN_ID_MARKS}"
_PLAIN_ID = re.compile(PLAIN_ID_PATTERN)
# The most scorer ids a request may name. A worker gives each run one error record per id it
# does not have, so the list was an amplifier: 1,000,000 distinct short ids beside 3 runs in a
# 6.7 MiB message asked for 3,000,000 records, each stored and sent to every sink. A registry
# holds tens of scorers (the built-in catalogue, about 25); past 100 a list is no producer's,
# and what it can ask of a worker stays what a registry of 100 scorers would make.
MAX_SCORER_IDS = 100
# The most (run, scorer id) pairs a message may ask for, over its requests (an id named twice in
# a request counts once: it is scored once). Each pair is a score or an error record, stored and
# sent to every sink, so runs x ids was the amplifier left: an 8 MiB message held ~31,000 minimal
# runs x 100 unknown ids, 3.1M records (measured 1,000 x 100: 23 s of a worker and 133 MiB of
# Redis; 3,100 x 100: 97 s, 419 MiB). Producers' batches are well under it by default: the
# exporter's batch_size runs [50] x a rule's ids (at most 100), 5,000; backfill's --batch-size
# [200] runs x 100 scorers, 20,000 (a trace's runs go together, so a batch passes batch_size by
# at most one trace's). The cutter (``RequestCutter``) closes a message before the bound and
# splits a trace's request by runs when it asks for more alone: only a --batch-size (up to 5,000)
# times scorers over 100,000, or a trace of over 100,000 / scorers runs, makes more messages
# than before. At the bound, unknown ids cost a worker ~23 s and Redis ~133 MiB of records:
# what 1,000 runs of a registry of 100 scorers ask for.
MAX_BATCH_PAIRS = 100_000


def plain_id(value: object) -> bool:
    """Whether ``value`` is a plain id (``PLAIN_ID_RULE``: ``PLAIN_ID_PATTERN`` matched whole):
    what a batch id and a task id must be. Celery and the workers log both as they are, so the
    workers refuse a message with any other (text of a producer's, an agent's content or a secret
    by mistake)."""
    return isinstance(value, str) and _PLAIN_ID.fullmatch(value) is not None


def shown_id(value: str | None) -> str | None:
    """``value`` (a batch id, a scorer id, a span's name) for a log line, a letter or a record: as
    it is when it is a plain id, else a digest of it (the same wherever it is shown). The guard
    refuses a message with any other batch id, but a message it did not screen (applied in
    process) may carry any text there, agent content included; a scorer id, any text the
    producer sent; a span's name, any text of the application's."""
    if value is None or plain_id(value):
        return value
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]


class ScoreRequest(BaseModel):
    """Score the run of each of ``target_span_ids`` among ``spans`` (one trace) with each of
    ``scorer_ids`` (ids in the worker's registry). Unknown fields are refused (the message of an
    older producer that shipped a read ``run`` fails validation naming it, never half-read).

    Compatibility, both ways: on the wire (``request_json``) a request of one run keeps the
    previous release's shape, ``"target_span_id": "<id>"``, which workers of both releases read
    (producers may be upgraded before the workers); only a request of several runs needs this
    release's workers. Read back, that shape is ``target_span_ids=[that id]``."""

    model_config = ConfigDict(extra="forbid")

    spans: list[SpanRecord] = Field(min_length=1)
    # The spans to score among ``spans`` (16 hex digits each), one per run, each once.
    target_span_ids: list[Annotated[str, Field(pattern=SPAN_ID_PATTERN)]] = Field(min_length=1)
    # Refused past ``MAX_SCORER_IDS`` before any id is read. Not refused twice over: the worker
    # scores an id named twice once, as producers of earlier releases sent them.
    scorer_ids: list[str] = Field(min_length=1, max_length=MAX_SCORER_IDS)
    source: Literal["live", "backfill"] = "live"
    job_id: str | None = None
    # Wall-clock (epoch seconds) when the run was handed to the queue; for latency figures.
    enqueued_at: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_target_of_old(cls, data: Any) -> Any:
        # The one-run shape: {"target_span_id": "<id>"} (anything but a string under that name
        # stays there, to be refused by its own name).
        if isinstance(data, dict) and isinstance(data.get("target_span_id"), str) and "target_span_ids" not in data:
            data = dict(data)
            data["target_span_ids"] = [data.pop("target_span_id")]
        return data

    @model_validator(mode="after")
    def _one_trace(self) -> ScoreRequest:
        trace_ids = {s.trace_id for s in self.spans}
        if len(trace_ids) > 1:
            raise ValueError(f"spans belong to {len(trace_ids)} traces; a request carries one trace")
        seen: set[str] = set()
        for span_id in self.target_span_ids:
            if span_id in seen:
                raise ValueError(f"target_span_ids names {span_id} twice; each run is scored once a request")
            seen.add(span_id)
        present = {s.span_id for s in self.spans}
        missing = [t for t in self.target_span_ids if t not in present]
        if missing:
            raise ValueError(
                f"target_span_ids {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
                f" not among the {len(self.spans)} spans"
            )
        if len(self.target_span_ids) > 1:
            runs = _runs_of(self.spans, self.target_span_ids)
            if isinstance(runs, tuple):
                # Each run would read the other's spans again: N nested targets cost N x N span
                # reads (2,000 in 430 KB took a worker 77 s). Producers plan top-level targets only.
                inner, outer = runs
                raise ValueError(
                    f"target_span_ids: {inner} is under {outer}; a run's target is never inside another run"
                )
        return self

    @property
    def trace_id(self) -> str:
        """The scored trace's id."""
        return self.spans[0].trace_id if self.spans else ""

    def pairs(self) -> int:
        """How many (run, scorer id) pairs the request asks for: scores or error records (an id
        named twice counts once, as the worker scores it once)."""
        return len(self.target_span_ids) * len(set(self.scorer_ids))

    def run_ids(self) -> list[str]:
        """``trace_id:span_id`` of each run to score (how dead letters and logs name runs)."""
        trace_id = self.trace_id
        return [f"{trace_id}:{span_id}" for span_id in self.target_span_ids]

    def targets(self) -> dict[str, SpanRecord]:
        """The record of each target span, by span id, in ``target_span_ids`` order (one pass
        over the spans, whatever the number of runs)."""
        wanted = set(self.target_span_ids)
        found: dict[str, SpanRecord] = {}
        for span in self.spans:
            if span.span_id in wanted:
                found.setdefault(span.span_id, span)
        return {t: found[t] for t in self.target_span_ids if t in found}

    def agent_labels(self) -> dict[str, str]:
        """Each target's agent name (as ``trace_to_run`` reads it), else its span's name: how
        summaries and tables label the runs (a lone surrogate as U+FFFD, as in score records, so
        that a terminal or a file can print them)."""
        return {
            span_id: without_lone_surrogates(
                (agent_name(RecordView(target)) or target.name)
                if classify(target.name, target.attributes) == "agent"
                else target.name
            )[0]
            for span_id, target in self.targets().items()
        }

    def run_spans(self) -> dict[str, list[SpanRecord]]:
        """The records each target's run is read from, in ``spans`` order: all the spans for a
        request with one target (as its producer planned it); with several, each target and its
        descendants (what ``plan_runs`` gives a run, what ``trace_to_run`` reads of it), so
        reading N runs costs the trace once, not N times. Targets under one another (validation
        refuses them; a request built unvalidated may hold them) share all the spans."""
        targets = self.target_span_ids
        if len(targets) == 1:
            return {targets[0]: self.spans}
        runs = _runs_of(self.spans, targets)
        return dict.fromkeys(targets, self.spans) if isinstance(runs, tuple) else runs

    def per_target(self) -> list[ScoreRequest]:
        """One request per target, each carrying only its run's records (``run_spans``): how a
        request too large for one message, or a crashed delivery's, is split run by run."""
        if len(self.target_span_ids) == 1:
            return [self]
        return [
            spans_request(spans, [target], self.scorer_ids, self.enqueued_at, source=self.source, job_id=self.job_id)
            for target, spans in self.run_spans().items()
        ]


def _runs_of(spans: list[SpanRecord], targets: list[str]) -> dict[str, list[SpanRecord]] | tuple[str, str]:
    """Each target's records (itself and its descendants, in ``spans`` order), or, when a target
    is under another, the first such (inner, outer) pair found. One walk of the spans however
    many targets: each span is owned by one target, and a second owner ends the walk. Validation
    and the worker's ``run_spans`` both call it: written for speed (no generator a span, a span
    met twice by its own target's walk, through a cycle or a repeated id, skipped when popped),
    a third of the time it took."""
    children: dict[str, list[str]] = {}
    for s in spans:
        parent = s.parent_span_id
        if parent is not None:
            kids = children.get(parent)
            if kids is None:
                children[parent] = [s.span_id]
            else:
                kids.append(s.span_id)
    owner_of: dict[str, str] = {}
    owner_get, kids_get = owner_of.get, children.get
    for target in targets:
        stack = [target]
        pop, extend = stack.pop, stack.extend
        while stack:
            span_id = pop()
            owner = owner_get(span_id)
            if owner is None:
                owner_of[span_id] = target
                if (kids := kids_get(span_id)) is not None:
                    extend(kids)
            elif owner != target:
                # Met at the target itself: it is under ``owner``; met below it: ``owner`` is.
                return (target, owner) if span_id == target else (owner, target)
    groups: dict[str, list[SpanRecord]] = {t: [] for t in targets}
    for s in spans:
        if (run := owner_get(s.span_id)) is not None:
            groups[run].append(s)
    return groups


_setattr = object.__setattr__
_Model = TypeVar("_Model", bound=BaseModel)


def _unvalidated(cls: type[_Model], values: dict[str, Any], fields_set: AbstractSet[str]) -> _Model:
    """What ``cls.model_construct(**values)`` builds, minus its per-field default and alias
    handling (~0.6 instead of ~3 µs): ``values`` must hold every field. For models built from
    data already validated, or validated by the worker; tests/tracing/test_span_record.py
    compares it with model_construct, so a pydantic change shows there."""
    model = cls.__new__(cls)
    _setattr(model, "__dict__", values)
    _setattr(model, "__pydantic_fields_set__", fields_set)
    _setattr(model, "__pydantic_extra__", None)
    _setattr(model, "__pydantic_private__", None)
    return model


class _OneRunRequest(BaseModel):
    """A request of one run in the previous release's shape, for ``request_json`` only (built
    unvalidated from a validated ``ScoreRequest``; its fields in that release's order)."""

    spans: list[SpanRecord]
    target_span_id: str
    scorer_ids: list[str]
    source: Literal["live", "backfill"] = "live"
    job_id: str | None = None
    enqueued_at: float | None = None


_ONE_RUN_FIELDS = frozenset(_OneRunRequest.model_fields)


def request_json(request: ScoreRequest) -> str:
    """``request`` as producers send it: one run as ``"target_span_id": "<id>"`` (what workers of
    the previous release read as well), several as ``target_span_ids``. The same text pydantic
    writes of the model (tests/tracing/test_json.py compares them), by orjson: the records are
    slots dataclasses it encodes natively, a quarter faster. A value orjson cannot encode (an
    integer past 64 bits) leaves it to pydantic. Never fails on text: see ``encode_request``."""
    return encode_request(request)[0]


def encode_request(request: ScoreRequest) -> tuple[str, int]:
    """``request_json(request)``, and how many of its texts had to be replaced to be written.

    Text no encoder can write (bytes that are not UTF-8: an OTLP ``bytesValue``; a lone
    surrogate: a ``\\ud800`` escape in an OTLP file, or a string an application built with
    ``surrogateescape``) would otherwise fail the request, and with it every request sharing its
    message. It is written with U+FFFD in place of each bad byte or surrogate, as the trace
    readers already read bytes, so the worker reads the run as an embedded backfill reads it.
    So is an object kombu would decode (``tracing._text``: the worker's screen would refuse the
    message), as its JSON text. Logged here (ids and a count, never the text); producers count
    it by run."""
    try:
        text = dumps_or(_wire_fields(request), lambda: _pydantic_json(request))
        if '"__type__"' not in text:  # the cheap test: orjson and pydantic write keys unescaped
            return text, 0
        fields, replaced = valid_text(request.__dict__)
        if not replaced:
            return text, 0
    except PydanticSerializationError:
        fields, replaced = valid_text(request.__dict__)
        if not replaced:
            raise
    log.warning(
        "request_text_replaced",
        trace_id=request.trace_id,
        runs=len(request.target_span_ids),
        texts=replaced,
        why="bytes not UTF-8, lone surrogates or objects kombu decodes, written as U+FFFD or JSON text",
    )
    valid = _unvalidated(ScoreRequest, fields, request.__pydantic_fields_set__)
    return dumps_or(_wire_fields(valid), lambda: _pydantic_json(valid)), replaced


def _wire_fields(request: ScoreRequest) -> dict[str, Any]:
    """The request's fields in their order on the wire: one target under the previous release's
    name (``_OneRunRequest``'s fields, exactly), several under ``target_span_ids``."""
    fields = request.__dict__
    targets = fields["target_span_ids"]
    wire: dict[str, Any] = {"spans": fields["spans"]}
    if len(targets) == 1:
        wire["target_span_id"] = targets[0]
    else:
        wire["target_span_ids"] = targets
    wire["scorer_ids"] = fields["scorer_ids"]
    wire["source"] = fields["source"]
    wire["job_id"] = fields["job_id"]
    wire["enqueued_at"] = fields["enqueued_at"]
    return wire


def _pydantic_json(request: ScoreRequest) -> str:
    """pydantic's encoding of the same fields: ``request_json``'s fallback and its reference."""
    wire = _wire_fields(request)
    if "target_span_id" not in wire:
        return request.model_dump_json()
    return _unvalidated(_OneRunRequest, wire, _ONE_RUN_FIELDS).model_dump_json()


class ScoreBatch(BaseModel):
    """One queue message: several requests, so the worker can fan out on one event loop.
    Unknown fields are refused, as a request's are: no release wrote any but these two, so a
    field a later release adds needs this release's workers upgraded first, as a request's
    field does (ignored, it was dropped unread)."""

    model_config = ConfigDict(extra="forbid")

    batch_id: str
    requests: list[ScoreRequest] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _pairs_bounded(cls, data: Any) -> Any:
        # Counted before a request is validated: a flood of runs is refused for its pairs, not read
        # span by span first (a request not of the shape counted fails its own validation).
        requests = data.get("requests") if isinstance(data, dict) else None
        if isinstance(requests, list):
            pairs = sum(_pairs_asked(r) for r in requests)
            if pairs > MAX_BATCH_PAIRS:
                raise ValueError(
                    f"requests ask for {pairs:,} (run, scorer id) pairs; a message asks for at most"
                    f" {MAX_BATCH_PAIRS:,} (tracing.queue.MAX_BATCH_PAIRS): send fewer runs or scorers per message"
                )
        return data

    def runs(self) -> int:
        """How many runs the batch asks to score (targets over its requests)."""
        return sum(len(r.target_span_ids) for r in self.requests)

    def pairs(self) -> int:
        """How many (run, scorer id) pairs the batch asks for (``ScoreRequest.pairs`` summed):
        at most ``MAX_BATCH_PAIRS``."""
        return sum(r.pairs() for r in self.requests)


def _pairs_asked(request: Any) -> int:
    """``request.pairs()`` of a request, model or not yet validated (0 for one of another shape:
    its own validation refuses it; so are more scorer ids than a request may name, unread)."""
    if isinstance(request, ScoreRequest):
        return request.pairs()
    if not isinstance(request, dict):
        return 0
    targets, ids = request.get("target_span_ids"), request.get("scorer_ids")
    if targets is None and isinstance(request.get("target_span_id"), str):
        runs = 1
    elif isinstance(targets, list):
        runs = len(targets)
    else:
        return 0
    if not isinstance(ids, list) or len(ids) > MAX_SCORER_IDS:
        return 0
    try:
        return runs * len(set(ids))
    except TypeError:  # an id that is no text (unhashable): refused as such
        return 0


_SPANS_REQUEST_SET = ("spans", "target_span_ids", "scorer_ids")


def spans_request(
    spans: list[SpanRecord],
    target_span_ids: list[str],
    scorer_ids: list[str],
    enqueued_at: float | None = None,
    *,
    source: Literal["live", "backfill"] = "live",
    job_id: str | None = None,
) -> ScoreRequest:
    """``ScoreRequest.model_construct(spans=, target_span_ids=, scorer_ids=, ...)``, not validated
    (the worker validates every message), the cheap way (``_unvalidated``): it is on the hot path."""
    fields_set = set(_SPANS_REQUEST_SET)
    if enqueued_at is not None:
        fields_set.add("enqueued_at")
    if source != "live":
        fields_set.add("source")
    if job_id is not None:
        fields_set.add("job_id")
    return _unvalidated(
        ScoreRequest,
        {
            "spans": spans,
            "target_span_ids": target_span_ids,
            "scorer_ids": list(scorer_ids),
            "source": source,
            "job_id": job_id,
            "enqueued_at": enqueued_at,
        },
        fields_set,
    )
