"""Delivery: drainer threads that take stored scores from the outbox to each sink.

One drainer thread per configured sink in each process that scores (every worker process,
prefork children too, and a command scoring in place); of a node's worker processes only one
drains each sink at a time (the holder of the node's turn, ``_NodeTurn``), the others stand by
and take over when it ends, so a prefork node polls the outbox once per sink, not once per
child. A drainer leases due score ids (``worker.store.Outbox``), reads their records, hands them
to its sink, and settles each id by the sink's answer: ``Delivered`` → acknowledged; ``Retry``
→ due again after a backoff (the sink's ``after_s`` at least); ``Refused``, or ``max_attempts``
used up → the sink's dead letter.
Concurrent drainers of one sink (other hosts, a node's processes in a take-over) are safe: a
lease hides its ids from them until it runs out, which is also what brings back the ids of a
drainer that died; a drainer renews its lease while a delivery is in flight (``_Heartbeat``), so
a slow backend is not handed the same batch twice.

Drainers wake when a batch stores new scores (``DrainerWaker``, the scoring code's writer) and
on a timer. A sink that raises, or answers a record with no ``Delivery``, is a bug: logged by
its type, its records retried (a dead letter naming it once the attempts are spent). Logs carry
ids, the sink's name and endpoint, counts and the backend's status (in the outcome's reason), never a score's
content.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

import tracing.sinks
from scorers import category_of
from tracing import ConsoleSink, JsonlSink, ScoreRecord, ScoreSink
from tracing.sinks import Delivered, Delivery, Refused, Retry
from worker._errors import SettingsError, StoreKeyTypeError
from worker._logs import CountedLog
from worker._settings import Settings
from worker.store import Lease, MemoryOutbox, Outbox, RedisOutbox, SinkCounts, SinkDeadLetter

__all__ = [
    "Deliveries",
    "DrainPolicy",
    "DrainerWaker",
    "build_sinks",
    "check_sinks",
    "process_deliveries",
    "start_process_deliveries",
    "stop_process_deliveries",
]

log = structlog.get_logger("tracescore.delivery")


def build_sinks(settings: Settings) -> list[ScoreSink]:
    """The sinks ``TRACESCORE_SINKS`` (else ``WRITER``) names, built from the settings; a value
    a sink refuses (a key with a line break, a URL of another scheme) is a ``SettingsError``."""
    sinks: list[ScoreSink] = []
    for name in settings.sink_names:
        try:
            sinks.append(_build_sink(name, settings))
        except SettingsError:
            raise
        except ValueError as exc:  # each sink's own check names the setting, never its value
            raise SettingsError(f"the {name} sink: {exc}") from None
    return sinks


def _build_sink(name: str, settings: Settings) -> ScoreSink:
    if name == "otlp":
        # (each backend's sink loads when named: a run that writes its scores to a file does
        # not load the OTLP exporter and the HTTP clients)
        return tracing.sinks.OtlpSink()
    if name == "jsonl":
        if not settings.jsonl_file:
            raise SettingsError("the jsonl sink needs TRACESCORE_JSONL_PATH (a file to append to)")
        return JsonlSink(settings.jsonl_file)
    if name == "console":
        return ConsoleSink()
    if name == "phoenix":
        url = _needed(settings.phoenix_url, "phoenix", "TRACESCORE_PHOENIX_URL")
        key = settings.phoenix_api_key.get_secret_value() if settings.phoenix_api_key else None
        return _sink_class("PhoenixSink")(url, api_key=key)
    if name == "mlflow":
        url = _needed(settings.mlflow_url, "mlflow", "TRACESCORE_MLFLOW_URL")
        token = settings.mlflow_token.get_secret_value() if settings.mlflow_token else None
        return _sink_class("MlflowSink")(url, token=token)
    if name == "langfuse":
        host = _needed(settings.langfuse_host, "langfuse", "TRACESCORE_LANGFUSE_HOST")
        public = _needed(settings.langfuse_public_key, "langfuse", "TRACESCORE_LANGFUSE_PUBLIC_KEY")
        secret = settings.langfuse_secret_key.get_secret_value() if settings.langfuse_secret_key else None
        return _sink_class("LangfuseSink")(host, public, _needed(secret, "langfuse", "TRACESCORE_LANGFUSE_SECRET_KEY"))
    raise SettingsError(f"unknown sink {name!r} in TRACESCORE_SINKS")


def check_sinks(settings: Settings) -> dict[str, str | None]:
    """Build each configured sink once and close it: what a sink refuses when built (a URL it
    cannot use, a key no HTTP header can carry, a proxy that is not http(s)) stops the worker's
    start naming the setting (``SettingsError``), instead of failing each task after it. Returns
    where each writes (``_sink_endpoints``), for the worker's start line."""
    sinks = build_sinks(settings)
    for sink in sinks:
        with contextlib.suppress(Exception):
            sink.close()
    return _sink_endpoints(sinks)


def _needed(value: str | None, sink: str, variable: str) -> str:
    if not value:
        raise SettingsError(f"the {sink} sink needs {variable}")
    return value


def _sink_class(name: str) -> Callable[..., ScoreSink]:
    found = getattr(tracing.sinks, name, None)
    if found is None:
        raise SettingsError(f"this tracescore has no {name} (tracing.sinks.{name} is missing)")
    return found  # type: ignore[no-any-return]


@dataclass(frozen=True)
class DrainPolicy:
    """How drainers take and retry (from ``TRACESCORE_SINK_*``)."""

    batch_size: int = 100
    lease_s: float = 60.0
    max_attempts: int = 12
    backoff_s: float = 1.0
    backoff_max_s: float = 300.0
    poll_s: float = 1.0

    @classmethod
    def of(cls, settings: Settings) -> DrainPolicy:
        return cls(
            batch_size=settings.sink_batch_size,
            lease_s=settings.sink_lease_seconds,
            max_attempts=settings.sink_max_attempts,
            backoff_s=settings.sink_backoff_seconds,
            backoff_max_s=settings.sink_backoff_max_seconds,
        )

    def delay(self, attempts: int, after_s: float) -> float:
        """The wait before the next attempt: doubling from ``backoff_s`` (±20 % jitter, so
        drainers of many processes spread out), capped, and never under the sink's ``after_s``."""
        # (The doubling stops at 64, past any cap: 2.0 ** 1024 overflows, which failed the settling
        # of a whole batch, delivered scores too, once a sink had been down that many attempts.)
        base = min(self.backoff_max_s, self.backoff_s * 2.0 ** min(max(0, attempts - 1), 64))
        return float(max(after_s, base * random.uniform(0.8, 1.2)))


def drain_once(sink: ScoreSink, outbox: Outbox, policy: DrainPolicy) -> int:
    """Lease one batch of ``sink``'s due ids, deliver it and settle each id; returns how many
    ids were leased (0: nothing due)."""
    lease = outbox.lease(sink.name, policy.batch_size, policy.lease_s)
    if not lease.attempts:
        return 0
    # Leased more often than allowed without ever being settled: each try ended before its
    # answer was recorded (a record that kills its drainer, a drainer stopped mid-delivery).
    spent = [s for s, n in lease.attempts.items() if n > policy.max_attempts]
    letters = [
        _letter(sink, s, lease.attempts[s], "max_attempts", f"{lease.attempts[s] - 1} attempts never settled")
        for s in spent
    ]
    found, unreadable = outbox.read([s for s in lease.ids if s not in spent])
    letters += [_letter(sink, s, lease.attempts[s], "unreadable_record", why) for s, why in unreadable.items()]
    if letters:
        outbox.dead(lease, letters)
        _say_dead_letters(sink, letters)
    gone = [s for s in lease.ids if s not in found and s not in unreadable and s not in spent]
    if gone:
        # Expired from the store (TTL) before this sink took it: nothing left to deliver.
        outbox.drop(lease, gone)
        log.warning(
            "sink_record_gone", **_sink_fields(sink), dropped=len(gone), score_id=gone[0], reason="record_expired"
        )
    records = [found[s] for s in lease.ids if s in found]
    if records:
        with _Heartbeat(sink, outbox, lease, policy.lease_s) as held:
            outcomes = _deliver(sink, records)
        _settle(sink, outbox, policy, held.lease, records, outcomes)
    return len(lease.ids)


class _Heartbeat:
    """Renews a lease every third of its length while a delivery is in flight, so a backend
    slower than the lease does not get the batch again from another drainer (and the first
    answer is not refused by a token that moved on). ``lease`` is the latest one, to settle by."""

    def __init__(self, sink: ScoreSink, outbox: Outbox, lease: Lease, lease_s: float) -> None:
        self.lease = lease
        self._sink = sink
        self._outbox = outbox
        self._lease_s = lease_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tracescore-lease-{lease.sink}", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.wait(self._lease_s / 3):
            try:
                self.lease = self._outbox.renew(self.lease, self._lease_s)
            except Exception as exc:  # the store away: the lease may lapse, at worst a re-send
                log.warning("sink_lease_renew_failed", **_sink_fields(self._sink), error_type=type(exc).__name__)


def _deliver(sink: ScoreSink, records: Sequence[ScoreRecord]) -> list[Delivery]:
    try:
        outcomes = sink.deliver(records)
    except Exception as exc:  # a bug in the sink: the records wait for a fixed one
        log.error("sink_crashed", **_sink_fields(sink), records=len(records), error_type=type(exc).__name__)
        if len(records) > 1:
            # One record may be what it trips on: one at a time, so the others still go.
            return [o for r in records for o in _deliver(sink, [r])]
        return [Retry(f"sink_crashed:{type(exc).__name__}")]
    if len(outcomes) != len(records):
        log.error("sink_answered_wrong_count", **_sink_fields(sink), records=len(records), outcomes=len(outcomes))
        return [Retry("sink_answered_wrong_count")] * len(records)
    answered: list[Delivery | None] = [o if isinstance(o, Delivered | Retry | Refused) else None for o in outcomes]
    if None in answered:  # a bug in the sink, as a raise is: those records wait for a fixed one
        log.error("sink_answered_no_outcome", **_sink_fields(sink), records=answered.count(None))
    return [Retry("sink_answered_no_outcome") if o is None else o for o in answered]


def _settle(
    sink: ScoreSink,
    outbox: Outbox,
    policy: DrainPolicy,
    lease: Lease,
    records: Sequence[ScoreRecord],
    outcomes: Sequence[Delivery],
) -> None:
    acked: list[str] = []
    delays: dict[str, float] = {}
    letters: list[SinkDeadLetter] = []
    retry_reasons: set[str] = set()
    for record, outcome in zip(records, outcomes, strict=True):
        attempts = lease.attempts.get(record.score_id)
        if attempts is None:
            # Left out of a renewal: queued anew meanwhile (its record replaced) or taken by
            # another drainer after the lease lapsed. Its settling is theirs; this batch's is ours.
            continue
        if isinstance(outcome, Delivered):
            acked.append(record.score_id)
        elif isinstance(outcome, Refused):
            letters.append(_letter(sink, record, attempts, outcome.reason, outcome.detail))
        elif attempts < policy.max_attempts:
            delays[record.score_id] = policy.delay(attempts, outcome.after_s)
            retry_reasons.add(outcome.reason)
        else:
            detail = f"{attempts} attempts; the last: {outcome.reason}"
            letters.append(_letter(sink, record, attempts, "max_attempts", detail))
    outbox.ack(lease, acked)
    outbox.retry(lease, delays)
    outbox.dead(lease, letters)
    if delays:  # (a sink down is a retry a batch, for as long as it is down)
        _retry_log(sink).note(len(delays), **_sink_fields(sink), reasons=sorted(retry_reasons))
    elif acked:  # it delivers again: the retries counted since the last line are said
        _retry_log(sink).flush()
    _say_dead_letters(sink, letters)


_retry_logs: dict[tuple[str, str | None], CountedLog] = {}
_retry_logs_lock = threading.Lock()
# A sink refusing every score (a revoked key, a deleted project) made a line per score: 100,000
# a day drowned every other line. One ``CountedLog`` per sink, endpoint and reason instead.
_dead_letter_logs: dict[tuple[str, str | None, str], CountedLog] = {}
_dead_letter_clock: Callable[[], float] = time.monotonic  # (a test's own clock)
# The reasons of one sink and endpoint with a line of their own; the others share one. A reason
# is the backend's answer, and one naming its own error codes had a line, and a log kept for good,
# for each code it made up.
_REASON_LINES = 32
_OTHER_REASONS = "(other reasons)"


def _sink_fields(sink: ScoreSink) -> dict[str, str | None]:
    """What a log line says of ``sink``: its backend and where it writes (``endpoint``, in
    ``shown_endpoint``'s form: password masked, query left out; None when the sink does not
    say). Every line naming a sink carries both: two collectors of one backend, one dead-lettering
    or crashing, could not be told apart by the backend alone."""
    endpoint = getattr(sink, "endpoint", None)
    return {"sink": sink.name, "endpoint": endpoint if isinstance(endpoint, str) else None}


def _sink_endpoints(sinks: Sequence[ScoreSink]) -> dict[str, str | None]:
    """Where each of ``sinks`` writes, by name: the lines naming every sink keep ``sinks`` as the
    names joined (as they always logged it) and add this beside it."""
    return {s.name: _sink_fields(s)["endpoint"] for s in sinks}


def _retry_log(sink: ScoreSink) -> CountedLog:
    """The sink's ``sink_retry`` line: one each 30 s with the records retried since the last.
    One per backend and endpoint: two collectors of one backend, one down, are two lines (the
    backend's name alone did not tell which was down, and one's line held back the other's)."""
    fields = _sink_fields(sink)
    key = (sink.name, fields["endpoint"])
    with _retry_logs_lock:
        found = _retry_logs.get(key)
        if found is None:
            found = _retry_logs[key] = CountedLog("sink_retry", logger=log, count_key="records", every_s=30.0)
        return found


def _say_dead_letters(sink: ScoreSink, letters: Sequence[SinkDeadLetter]) -> None:
    """The ``sink_dead_letter`` ERROR line: the first of a sink and reason at once, then one a
    minute with the letters since (``letters``) and the last one's id and attempts; the rest is
    said when the drainers stop. The reason is the backend's answer (``otlp_http_401``), never a
    score's content (the letter's ``detail`` stays in the letter). Past ``_REASON_LINES`` reasons
    of a sink, the others share one line ("(other reasons), the last: ...")."""
    by_reason: dict[str, list[SinkDeadLetter]] = {}
    for letter in letters:
        by_reason.setdefault(letter.reason, []).append(letter)
    fields = _sink_fields(sink)
    for reason, some in by_reason.items():
        key = (sink.name, fields["endpoint"], reason)
        with _retry_logs_lock:
            said = _dead_letter_logs.get(key)
            if said is None and sum(k[:2] == key[:2] for k in _dead_letter_logs) >= _REASON_LINES:
                key = (sink.name, fields["endpoint"], _OTHER_REASONS)
                said = _dead_letter_logs.get(key)
            if said is None:
                said = _dead_letter_logs[key] = CountedLog(
                    "sink_dead_letter", logger=log, count_key="letters", clock=_dead_letter_clock, level="error"
                )
        last = some[-1]
        shown = reason if key[2] != _OTHER_REASONS else f"{_OTHER_REASONS}, the last: {reason}"
        said.note(len(some), **fields, score_id=last.score_id, reason=shown, attempts=last.attempts)


def _flush_dead_letter_logs(sinks: Sequence[ScoreSink]) -> None:
    """Say the letters counted since each line of ``sinks`` (the drainers stop: no count unsaid)."""
    names = {s.name for s in sinks}
    with _retry_logs_lock:
        found = [said for key, said in _dead_letter_logs.items() if key[0] in names]
    for said in found:
        said.flush()


def _letter(sink: ScoreSink, record: ScoreRecord | str, attempts: int, reason: str, detail: str) -> SinkDeadLetter:
    """The dead letter of a record (or of an id whose record cannot be read)."""
    if isinstance(record, str):
        return SinkDeadLetter(score_id=record, sink=sink.name, reason=reason, detail=detail[:1000], attempts=attempts)
    return SinkDeadLetter(
        score_id=record.score_id,
        sink=sink.name,
        reason=reason,
        detail=detail[:1000],
        attempts=attempts,
        trace_id=record.trace_id,
        span_id=record.span_id,
        scorer_id=record.scorer_id,
    )


class _NodeTurn:
    """Whether this process is its node's drainer of one sink of one store: an exclusive POSIX
    lock (``lockf``) on a file in the temp directory. POSIX locks belong to a process (a forked
    prefork child does not inherit its parent's) and go with it when it ends, so another process
    of the node takes over within a poll. Without a turn (a file we may not open) we drain
    anyway: delivery stays correct, only busier."""

    def __init__(self, store_key: str, sink: str) -> None:
        digest = hashlib.sha256(f"{store_key}\x1f{sink}".encode()).hexdigest()[:16]
        self.path = os.path.join(tempfile.gettempdir(), f"tracescore-drainer-{digest}.lock")
        self._fd: int | None = None

    def held(self) -> bool:
        if self._fd is not None:
            return True
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            log.warning("drainer_turn_unavailable", error_type=type(exc).__name__)
            return True
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops this process's lock
            self._fd = None


class _Drainer:
    """One sink's drainer thread, with an outbox client of its own; with a ``turn``, it drains
    only while this process holds its node's turn for the sink."""

    def __init__(
        self, sink: ScoreSink, outbox: Callable[[], Outbox], policy: DrainPolicy, turn: _NodeTurn | None = None
    ) -> None:
        self.sink = sink
        self._outbox_factory = outbox
        self.policy = policy
        self.turn = turn
        self.wakeup = threading.Event()
        self.stopping = threading.Event()
        # Set when a pass found nothing due (what is queued waits for a backoff, or nothing is).
        self.idle = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"tracescore-drainer-{sink.name}", daemon=True)

    def _run(self) -> None:
        outbox: Outbox | None = None
        failures = 0
        while not self.stopping.is_set():
            if self.turn is not None and not self.turn.held():
                # Another process of this node drains this sink: nothing for us to do.
                self.idle.set()
                self.wakeup.wait(self.policy.poll_s)
                self.wakeup.clear()
                continue
            try:
                if outbox is None:
                    outbox = self._outbox_factory()
                    outbox.register([self.sink.name])
                leased = drain_once(self.sink, outbox, self.policy)
                failures = 0
            except Exception as exc:  # the outbox's store away (a Redis restart): wait, try again
                failures += 1
                # A key of the wrong type stays until an operator moves it aside: say which.
                named = {"key": exc.key, "found": exc.found} if isinstance(exc, StoreKeyTypeError) else {}
                log.warning(
                    "drainer_failed", **_sink_fields(self.sink), error_type=type(exc).__name__,
                    category=category_of(exc), failures=failures, **named,
                )  # fmt: skip
                self.stopping.wait(min(30.0, 0.5 * 2 ** min(failures, 6)))
                continue
            if not leased:
                self.idle.set()
                self.wakeup.wait(self.policy.poll_s)
                self.wakeup.clear()
        if outbox is not None:
            try:
                outbox.close()
            except Exception:
                log.warning("drainer_close_failed", **_sink_fields(self.sink), exc_info=True)
        if self.turn is not None:
            self.turn.release()


class Deliveries:
    """The drainers of one process: one per sink, over outboxes that ``outbox`` makes (one per
    thread: a Redis client is not shared across threads)."""

    def __init__(
        self,
        sinks: Sequence[ScoreSink],
        outbox: Callable[[], Outbox],
        policy: DrainPolicy | None = None,
        *,
        node_key: str | None = None,
    ) -> None:
        """``node_key`` (the store's URL): one drainer per sink per node and store drains, the
        one whose process holds the node's turn (``_NodeTurn``); None: these drainers always do."""
        self.sinks = list(sinks)
        self.policy = policy or DrainPolicy()
        self._outbox = outbox
        self._drainers = [
            _Drainer(s, outbox, self.policy, _NodeTurn(node_key, s.name) if node_key is not None else None)
            for s in self.sinks
        ]
        self._started = False
        self.pid = os.getpid()

    def start(self) -> Deliveries:
        if not self._started:
            self._started = True
            for drainer in self._drainers:
                drainer.thread.start()
        return self

    def wake(self) -> None:
        for drainer in self._drainers:
            drainer.wakeup.set()

    def flush(self, timeout_s: float) -> bool:
        """Wake the drainers and wait (up to ``timeout_s``) until each has found nothing more
        due: what was stored before is delivered, or waits for a retry. True if all got there."""
        live = [d for d in self._drainers if d.thread.is_alive()]
        for drainer in live:
            drainer.idle.clear()
            drainer.wakeup.set()
        deadline = time.monotonic() + timeout_s
        return all(d.idle.wait(max(0.0, deadline - time.monotonic())) for d in live)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the drainers (what they hold comes back when its lease runs out) and close the
        sinks of those that ended within ``timeout_s`` (a drainer still delivering keeps its sink)."""
        for drainer in self._drainers:
            drainer.stopping.set()
            drainer.wakeup.set()
        deadline = time.monotonic() + timeout_s
        for drainer in self._drainers:
            if drainer.thread.is_alive():
                drainer.thread.join(max(0.0, deadline - time.monotonic()))
        _flush_dead_letter_logs(self.sinks)
        for drainer in self._drainers:
            if drainer.thread.is_alive():
                # Still delivering: closing the sink under it could block past the shutdown
                # grace (a pool waiting for its requests) or write to a closed file. The
                # (daemon) thread ends with the process; its lease brings the ids back.
                log.warning("sink_close_skipped", **_sink_fields(drainer.sink), reason="drainer_still_delivering")
                continue
            try:
                drainer.sink.close()
            except Exception as exc:
                log.warning("sink_close_failed", **_sink_fields(drainer.sink), error_type=type(exc).__name__)

    def finish(self, outbox: MemoryOutbox, timeout_s: float) -> dict[str, SinkCounts]:
        """For a command scoring in place: stop the threads, then drain ``outbox`` here until
        nothing is queued or ``timeout_s`` has passed (retries wait their backoff, inside that
        time); returns each sink's counts. The wait ends at ``timeout_s`` but for one delivery
        under way (each bounded by its sink's own timeout): a drainer still delivering then is
        left to it, its sink not used from here, and its scores count as pending."""
        deadline = time.monotonic() + timeout_s
        for drainer in self._drainers:
            drainer.stopping.set()
            drainer.wakeup.set()
        for drainer in self._drainers:
            if drainer.thread.is_alive():
                drainer.thread.join(max(0.0, deadline - time.monotonic()))
        free = [d.sink for d in self._drainers if not d.thread.is_alive()]
        while free and time.monotonic() < deadline:
            if sum(drain_once(s, outbox, self.policy) for s in free):
                continue
            wait = outbox.next_due_s()
            if wait is None:
                break
            time.sleep(max(0.0, min(wait + 0.01, deadline - time.monotonic())))
        counts = outbox.counts()
        self.stop(0.0)
        return counts


class DrainerWaker:
    """The ``ScoreWriter`` the scoring code calls after storing new records: wakes the drainers."""

    def __init__(self, deliveries: Deliveries) -> None:
        self.deliveries = deliveries

    def write(self, records: Sequence[ScoreRecord]) -> None:
        self.deliveries.wake()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Before the process exits: let the drainers deliver what is due (the rest stays queued)."""
        return self.deliveries.flush(timeout_s)

    def close(self) -> None:
        return None


_lock = threading.Lock()
_process: Deliveries | None = None


def start_process_deliveries(settings: Settings) -> Deliveries | None:
    """This process's drainers over the Redis outbox, started once per process (a forked child
    starts its own); None when no sink is configured."""
    global _process
    with _lock:
        if _process is not None and _process.pid == os.getpid():
            return _process
        if not settings.sink_names:
            return None
        url, bound = settings.store_url, settings.sink_max_dead_letters
        _process = Deliveries(
            build_sinks(settings),
            lambda: RedisOutbox(url, max_dead_letters=bound),
            DrainPolicy.of(settings),
            node_key=url,
        ).start()
        log.info(
            "drainers_started", pid=os.getpid(), sinks=",".join(settings.sink_names),
            endpoints=_sink_endpoints(_process.sinks),
        )  # fmt: skip
        return _process


def process_deliveries() -> Deliveries | None:
    """This process's drainers, if started."""
    current = _process
    return current if current is not None and current.pid == os.getpid() else None


def stop_process_deliveries(timeout_s: float = 5.0) -> None:
    """Stop this process's drainers (a worker shutting down), after letting them deliver what
    is due for up to ``timeout_s`` (what is left stays queued for the other workers)."""
    global _process
    with _lock:
        current, _process = _process, None
    if current is not None and current.pid == os.getpid():
        current.flush(timeout_s)
        current.stop(timeout_s)
