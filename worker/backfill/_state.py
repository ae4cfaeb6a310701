"""A backfill job's state: what it reads, with which options, how far it got, what it counted.

In Redis mode the state lives under ``tracescore:backfill:<job id>`` (JSON) beside the set of
runs already enqueued (``tracescore:backfill-runs:<job id>``, trace id and target span id) and the
list of the traces read (``tracescore:backfill-rootless:<job id>``, named when it held only those
read without their root), all with a TTL; each save also adds the job to the index of jobs
(``tracescore:backfill-jobs``) that ``tracescore status`` lists them from. The checkpoint is the
earliest input position whose traces are not all enqueued yet, so ``--resume`` starts reading
there, and the set keeps the runs read again past that point (and any run the input holds twice)
from being enqueued twice; the list lets the resume tell a span or root that comes late for a
trace read before the checkpoint from a new trace.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar

from pydantic import BaseModel, Field, ValidationError, field_validator

from tracing.sources import DEFAULT_MAX_OPEN_BYTES, Position, Released
from worker._errors import UnreadableStateError
from worker._keys import (
    backfill_hold_key,
    backfill_jobs_key,
    backfill_rootless_key,
    backfill_runs_key,
    backfill_state_key,
    backfill_traces_key,
)
from worker._reconnect import COMMAND_SLACK_S, DECODED
from worker._settings import Settings
from worker.store import checked, checked_script, finish_job, validation_place

if TYPE_CHECKING:
    from worker.backfill._outage import RideOut

__all__ = [
    "BOUNDED",
    "BackfillOptions",
    "BackfillState",
    "JobCounters",
    "JobHold",
    "LateCause",
    "RedisJobStore",
    "late_by_option",
    "late_cause",
    "late_said",
    "new_job_id",
    "run_id",
    "store_client",
]

# Every exchange of the backfill's own clients with Redis is bounded: redis-py before 8.0 (kombu
# allows 6.4) waits for an answer for good, so a backfill meeting a Redis that stopped answering
# (paused, a network partition) hung, past its Job's grace period on SIGTERM, where 8.0 gives up
# after 5 s. A command's own time is the store calls' slack (a save of a batch's run ids, an MGET
# of 1,000 records).
BOUNDED: dict[str, Any] = {"socket_connect_timeout": 5.0, "socket_timeout": COMMAND_SLACK_S}

T = TypeVar("T")


def store_client(settings: Settings) -> Any:
    """A client of the score store for the backfill (replies decoded, every exchange bounded)."""
    import redis

    return redis.Redis.from_url(settings.store_url, **DECODED, **BOUNDED)


JOB_TTL_SECONDS = 7 * 24 * 3600
# Traces read a job keeps (the newest), as many as its assembler remembers
# (``TraceAssembler.released_kept``, at least this).
RELEASED_KEPT = 10_000
# A list entry of a trace read with its root; a bare trace id is one read without it (all an
# earlier release kept). Before either, why it was read: _EVICTED, released early by the memory
# bound, or _WINDOW, its window passed (an entry of an earlier release may have neither: not
# known). After the id, _RUNS and what a later part of it needs to find a run of its own
# (``plan_part``'s summary; none: a later part holds no run). Before all, _UNSENT: runs of it
# were planned and none enqueued (each rejected), so the batch that sends a late run of it counts
# it in ``traces_enqueued``. Trace ids are hex: no entry of one starts so, nor holds "/".
_UNSENT = "u:"
_ROOTED = "r:"
_EVICTED = "m:"
_WINDOW = "w:"
_RUNS = "/"
MAX_MALFORMED_KEPT = 50


class LateCause(NamedTuple):
    """Why a trace was read (released) before a late span or root of it came, and the options
    that would have kept it open."""

    key: str  # a key of the summary's late counts by option: the option to raise, or "unknown"
    released: str  # how the trace was released, as the messages and the summary say it
    advice: str  # what the summary says to do
    settings: tuple[str, ...]  # the options to raise, as ``BackfillOptions`` names them
    counter: str  # the suffix of the job's counters of late spans and roots so released

    def raise_now(self, options: BackfillOptions) -> str:
        """What a trace's line says to raise, each option with its value in the job."""
        return "raise " + ", or ".join(f"--{s.replace('_', '-')}, now {getattr(options, s):,}" for s in self.settings)


# Its window passed (raising --window-spans keeps a trace open, with its root or without), or the
# memory bound released it early (``AssembledTrace.late_evicted``): a wider window keeps it no
# longer; or a job saved by an earlier release, whose list of traces read did not say why.
_WINDOW_CAUSE = LateCause(
    "--window-spans",
    "past the assembly window",
    "widen it with --window-spans / --window-files",
    ("window_spans",),
    "_window",
)
# (Its key, the summary's JSON since before --max-open-mb, stands for either memory bound.)
_EVICTED_CAUSE = LateCause(
    "--max-open-spans",
    "released early by the memory bound",
    "raise --max-open-spans or --max-open-mb",
    ("max_open_spans", "max_open_mb"),
    "_evicted",
)
_UNKNOWN_CAUSE = LateCause(
    "unknown",
    "read by an earlier release, which kept no cause",
    "widen --window-spans or raise --max-open-spans / --max-open-mb",
    ("window_spans", "max_open_spans", "max_open_mb"),
    "",
)
_LATE_CAUSES = (_WINDOW_CAUSE, _EVICTED_CAUSE, _UNKNOWN_CAUSE)


def late_cause(evicted: bool | None) -> LateCause:
    """The cause of a late span or root whose trace was (``evicted``) or was not evicted when it
    was read (None: not known)."""
    return _UNKNOWN_CAUSE if evicted is None else _EVICTED_CAUSE if evicted else _WINDOW_CAUSE


def late_by_option(late: int, window: int, evicted: int) -> dict[str, int]:
    """``late`` spans (or roots), ``window`` of them of traces whose window passed and ``evicted``
    of traces the memory bound released, by the option that would have kept their trace open
    (the rest ``unknown``: counted by an earlier release, or of traces it read; the keys with
    none left out)."""
    counts = (window, evicted, max(0, late - window - evicted))
    return {cause.key: n for cause, n in zip(_LATE_CAUSES, counts, strict=True) if n}


def late_said(by_option: dict[str, int]) -> str:
    """A summary's words for ``late_by_option``'s counts: how many, why, and what to raise."""
    return "; ".join(
        f"{n:,} {cause.released}, {cause.advice}" for cause in _LATE_CAUSES if (n := by_option.get(cause.key, 0))
    )


def run_id(trace_id: str, span_id: str) -> str:
    """One run of a job: its trace and its target span (what the job must enqueue once)."""
    return f"{trace_id}:{span_id}"


def new_job_id() -> str:
    """Short, sortable by time, unique enough: ``bf-<yyyymmdd-hhmmss>-<6 hex>``."""
    return time.strftime("bf-%Y%m%d-%H%M%S-", time.gmtime()) + secrets.token_hex(3)


class BackfillOptions(BaseModel):
    """What the job scores, and how it reads; fixed at the start, reused by ``--resume``."""

    scorers_module: str
    scorer_ids: list[str] = Field(min_length=1)
    since_ns: int | None = None
    until_ns: int | None = None
    sample_rate: float = Field(default=1.0, ge=0.0, le=1.0)
    batch_size: int = Field(default=200, ge=1)
    window_spans: int = Field(default=10_000, ge=1)
    window_files: int = Field(default=1, ge=0)
    max_open_spans: int = Field(default=100_000, ge=1)
    # The span text held while assembling, in MiB (a job saved before it: the default).
    max_open_mb: int = Field(default=DEFAULT_MAX_OPEN_BYTES // 2**20, ge=1)
    # --max-cost: the job's judge spend limit in USD (None: only the daily TRACESCORE_BUDGETS).
    max_cost_usd: float | None = Field(default=None, ge=0)

    @field_validator("scorer_ids")
    @classmethod
    def _each_once(cls, ids: list[str]) -> list[str]:
        # A scorer named twice (--scorer x --scorer x) is scored once a run, as the workers
        # read a request's ids; counted twice, the job expected a score it would never get.
        return list(dict.fromkeys(ids))


class JobCounters(BaseModel):
    """Cumulative over every run (and resume) of the job."""

    traces_read: int = 0
    runs_read: int = 0
    runs_enqueued: int = 0
    # The traces of those runs, each once: counted with the batch sending its first runs.
    traces_enqueued: int = 0
    batches: int = 0
    skipped: dict[str, int] = Field(default_factory=dict)
    unreadable: dict[str, int] = Field(default_factory=dict)
    malformed: int = 0
    malformed_where: list[str] = Field(default_factory=list)
    evicted_traces: int = 0
    # Roots that arrived after their trace was released without one (read without its root).
    late_roots: int = 0
    # Other spans that arrived after their trace was released (read without them), but those
    # that make a run of their own (``late_runs``).
    late_spans: int = 0
    # Of those, the ones whose trace the memory bound released, and those whose window passed
    # (``late_by_option``). A job saved by an earlier release counted neither or no window: its
    # late spans and roots so far are of no known cause.
    late_roots_evicted: int = 0
    late_spans_evicted: int = 0
    late_roots_window: int = 0
    late_spans_window: int = 0
    # Runs of late spans scored (each a whole run of the trace that no part read before held:
    # a trace without an agent, say, whose later top-level LLM call came past its window),
    # counted with the batch that enqueues them (a dry run: when planned); read again, they are
    # ``runs_read_again`` alone.
    late_runs: int = 0
    # Runs not enqueued, by reason (``too_large``: one run over the broker's message cap).
    runs_rejected: dict[str, int] = Field(default_factory=dict)
    # Runs enqueued with U+FFFD for text no JSON can hold (bytes not UTF-8, lone surrogates).
    runs_text_replaced: int = 0
    # Runs planned again after the job had enqueued them (an input file given twice, spans
    # written twice, a resume reading again past its checkpoint): not enqueued again.
    runs_read_again: int = 0
    # Spans past the assembler's cap on one trace (max_spans_per_trace): the trace is read without them.
    spans_dropped: int = 0

    def skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + n

    def unread(self, reason: str) -> None:
        self.unreadable[reason] = self.unreadable.get(reason, 0) + 1

    def reject(self, reason: str) -> None:
        self.runs_rejected[reason] = self.runs_rejected.get(reason, 0) + 1

    def bad_line(self, where: str) -> None:
        self.malformed += 1
        if len(self.malformed_where) < MAX_MALFORMED_KEPT:
            self.malformed_where.append(where)


class BackfillState(BaseModel):
    job_id: str
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    source: dict[str, Any]
    source_label: str = ""
    options: BackfillOptions
    status: Literal["reading", "interrupted", "enqueued", "finished"] = "reading"
    # The queue its runs go to (Redis mode): a resume sends the rest there, whatever
    # TRACESCORE_QUEUE says then (None: a state of an earlier release, which kept no queue).
    queue: str | None = None
    checkpoint: tuple[int, int, int] = (0, 0, 0)
    # Traces handed over that began before the checkpoint and reach it: the position of each
    # one's last span (a resume skips their spans up to there, read and counted already).
    read_through: dict[str, tuple[int, int, int]] = Field(default_factory=dict)
    counters: JobCounters = Field(default_factory=JobCounters)
    elapsed_s: float = 0.0

    @property
    def position(self) -> Position:
        return Position(*self.checkpoint)

    @property
    def expected_scores(self) -> int:
        return self.counters.runs_enqueued * len(self.options.scorer_ids)


# What each key of a job holds (for ``checked``): all but the hold are kept when of another type
# (refused, ``StoreKeyTypeError``): the state, and the runs and traces without which a resume
# would enqueue again or score twice, cannot be rebuilt. The hold, a lock, guards no data and no
# holder could ever release it: repaired.
_WHERE = "backfill"


def _kept(key: str, kind: str) -> tuple[str, str, bool]:
    return (key, kind, True)


# The state and the enqueued runs are written only while the job's hold is this process's: a
# process paused past the hold (or whose lock Redis lost) and then woken went on reading and
# saved over the new holder's state (its counts, then "finished"), with no word. Without a hold
# (ARGV[1] empty) they are written as they are. Each key's type is checked first: a key of
# another type leaves the whole save unwritten (a MULTI went on past the failed command).
# The index of jobs (KEYS[5], ``tracescore status``'s list) gets the job at each save (NX: its
# start stays its first save's), so a job whose id ``status`` removed, or the index of another
# type repaired (it guards no data), is listed again at its next save.
_SAVE_IF_HELD = checked_script(
    "{KEYS[1], 'string', 'r', KEYS[2], 'string', 'k', KEYS[3], 'set', 'k', KEYS[4], 'list', 'k', KEYS[5], 'zset', 'r'}",
    """
if ARGV[1] ~= '' and redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
-- This very save already done (its state, stamped with its time.time(), is written last): sent again
-- after Redis ran it and the reply was lost (a restart), it appended the read traces twice.
if redis.call('get', KEYS[2]) == ARGV[2] then return 1 end
redis.call('zadd', KEYS[5], 'NX', ARGV[7], ARGV[6])
local runs_end = 7 + tonumber(ARGV[4])
for i = 8, runs_end, 4000 do redis.call('sadd', KEYS[3], unpack(ARGV, i, math.min(i + 3999, runs_end))) end
for i = runs_end + 1, #ARGV, 4000 do redis.call('rpush', KEYS[4], unpack(ARGV, i, math.min(i + 3999, #ARGV))) end
if #ARGV > runs_end then redis.call('ltrim', KEYS[4], -tonumber(ARGV[5]), -1) end
-- Each save renews all three, added to or not: a job resumed after a pause of days kept its
-- state, but its runs and read traces expired (a resume enqueued runs again, and took late
-- roots for new traces).
redis.call('expire', KEYS[3], ARGV[3])
redis.call('expire', KEYS[4], ARGV[3])
redis.call('set', KEYS[2], ARGV[2], 'EX', ARGV[3])
return 1
""",
)


# A job's keys and its entry in the index of jobs (KEYS[5]; ARGV[1]: the job id) gone in one step:
# a delete that left the entry had ``status`` list the job until its next read of every state.
# The index is checked first (repaired, as at a save), so the keys go with the entry or not at all.
_DELETE = checked_script(
    "{KEYS[5], 'zset', 'r'}",
    """
redis.call('del', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
redis.call('zrem', KEYS[5], ARGV[1])
return 1
""",
)


class RedisJobStore:
    """Job state and the enqueued-run set in Redis (sync client: the driver is sync). With a
    ``hold`` (the running job's), nothing is written once the hold is another process's. A key
    of the job holding another Redis type raises ``StoreKeyTypeError`` (left as it is), a state
    that does not read ``UnreadableStateError``. With ``ride_out`` (a running job's), the calls a
    job makes as it goes (``save``, ``already_enqueued``, ``released``) wait for a Redis that is
    away (``RideOut``); without (``status``), they fail at once."""

    def __init__(self, client: Any, hold: JobHold | None = None, ride_out: RideOut | None = None) -> None:
        self.client = client
        self.hold = hold
        self.ride_out = ride_out
        self._save_if_held = client.register_script(_SAVE_IF_HELD)  # (by SHA once loaded)
        self._delete = client.register_script(_DELETE)
        # Job id -> whether it has an earlier release's set of enqueued trace ids (asked once).
        self._legacy: dict[str, bool] = {}

    def _riding(self, what: str, call: Callable[[], T]) -> T:
        return call() if self.ride_out is None else self.ride_out(what, call)

    def load(self, job_id: str) -> BackfillState | None:
        key = backfill_state_key(job_id)
        raw = checked(self.client, _WHERE, [_kept(key, "string")], lambda: self.client.get(key))
        if raw is None:
            return None
        try:
            return BackfillState.model_validate_json(raw)
        except ValidationError as exc:  # (its text would quote the stored value)
            from worker.metrics import observe_unreadable  # (as the store: loaded only for this)

            observe_unreadable("backfill_state")
            where = validation_place(exc.errors()[0]["loc"])
            raise UnreadableStateError(key, f"{exc.error_count()} problem(s), first at {where}") from None

    def save(
        self,
        state: BackfillState,
        newly_enqueued: Sequence[str] = (),
        newly_released: Sequence[Released] = (),
        released_kept: int = RELEASED_KEPT,
        unsent: Collection[str] = (),
    ) -> bool:
        """Store the state, add ``newly_enqueued`` run ids (``run_id``) and append
        ``newly_released`` traces (the newest ``released_kept`` kept; those in ``unsent`` marked:
        runs of it planned, none enqueued), in one step; False (nothing written, the hold marked
        lost) when the hold is another process's."""
        state.updated_at = time.time()
        job_id = state.job_id
        keys = (backfill_hold_key(job_id), backfill_state_key(job_id), backfill_runs_key(job_id))
        args = (
            self.hold.token if self.hold is not None else "",
            state.model_dump_json(),
            JOB_TTL_SECONDS,
            len(newly_enqueued),
            released_kept,
            job_id,
            state.created_at,
            *newly_enqueued,
            *(
                f"{_UNSENT if trace_id in unsent else ''}"
                f"{_EVICTED if evicted else '' if evicted is None else _WINDOW}{_ROOTED if rooted else ''}{trace_id}"
                f"{'' if runs is None else _RUNS + runs}"
                for trace_id, rooted, evicted, runs in newly_released
            ),
        )
        saved = self._riding(
            "saving the job's state",
            lambda: checked(
                self.client,
                _WHERE,
                [],  # (the script checks its keys itself)
                lambda: self._save_if_held(keys=(*keys, backfill_rootless_key(job_id), backfill_jobs_key()), args=args),
            ),
        )
        if not saved and self.hold is not None:
            self.hold.lost.set()
        return bool(saved)

    def released(self, job_id: str) -> tuple[list[Released], set[str]]:
        """The traces the job read (``save``'s ``newly_released``), oldest first, and those of them
        whose runs planned were none enqueued (as its newest entry says: ``save``'s ``unsent``)."""
        key = backfill_rootless_key(job_id)
        found = self._riding(
            "reading the job's traces",
            lambda: checked(self.client, _WHERE, [_kept(key, "list")], lambda: self.client.lrange(key, 0, -1)),
        )
        released, unsent = [], set()
        for entry in found:
            marked = entry.decode() if isinstance(entry, bytes) else str(entry)
            text = marked.removeprefix(_UNSENT)
            evicted = True if text.startswith(_EVICTED) else False if text.startswith(_WINDOW) else None
            rest = text.removeprefix(_EVICTED).removeprefix(_WINDOW)
            trace_id, has_runs, runs = rest.removeprefix(_ROOTED).partition(_RUNS)
            released.append(Released(trace_id, rest.startswith(_ROOTED), evicted, runs if has_runs else None))
            if marked.startswith(_UNSENT):
                unsent.add(trace_id)
            else:
                unsent.discard(trace_id)
        return released, unsent

    def still_held(self) -> bool:
        """Whether this process may go on with the job: its hold is still its own (asked of
        Redis: the renewer notices a lost hold only at its next turn). True without a hold."""
        return self.hold is None or self.hold.confirm()

    def already_enqueued(self, job_id: str, run_ids: Sequence[str]) -> set[str]:
        """Those of ``run_ids`` the job enqueued before. A job an earlier release started kept
        trace ids instead: each run of a trace in that set counts as enqueued (that release sent
        a trace's runs together)."""
        if not run_ids:
            return set()
        return self._riding("reading the job's runs", lambda: self._enqueued(job_id, run_ids))

    def _enqueued(self, job_id: str, run_ids: Sequence[str]) -> set[str]:
        runs_key, traces_key = backfill_runs_key(job_id), backfill_traces_key(job_id)
        if job_id not in self._legacy:
            self._legacy[job_id] = bool(self.client.exists(traces_key))
        flags = checked(
            self.client, _WHERE, [_kept(runs_key, "set")], lambda: self.client.smismember(runs_key, list(run_ids))
        )
        done = {r for r, f in zip(run_ids, flags, strict=True) if f}
        if self._legacy[job_id]:
            traces = list({r.partition(":")[0] for r in run_ids})
            old = checked(
                self.client, _WHERE, [_kept(traces_key, "set")], lambda: self.client.smismember(traces_key, traces)
            )
            done_traces = {t for t, f in zip(traces, old, strict=True) if f}
            done.update(r for r in run_ids if r.partition(":")[0] in done_traces)
        return done

    def run_ids(self, job_id: str, count: int = 5000) -> Iterator[str] | None:
        """Every run id the job enqueued, over all its runs and resumes (SSCAN, ``count`` a call:
        one round trip per ``count`` runs, never the whole set in memory); None for a job an
        earlier release started, whose first runs are kept as trace ids (their spans unknown).
        The set does not change once the job is finished (its hold is this process's), so the
        scan yields each run once. A set of another type raises here, not in the middle of the
        scan."""
        if self.client.exists(backfill_traces_key(job_id)):
            return None
        key = backfill_runs_key(job_id)
        cursor, first = checked(
            self.client, _WHERE, [_kept(key, "set")], lambda: self.client.sscan(key, 0, count=count)
        )
        return self._scan(key, cursor, first, count)

    def _scan(self, key: str, cursor: int, page: list[Any], count: int) -> Iterator[str]:
        while True:
            yield from (str(r) for r in page)
            if not cursor:
                return
            cursor, page = self.client.sscan(key, cursor, count=count)

    def finished(self, job_id: str) -> None:
        """The job is done: its counts are final from now on (``JobStats.finish``: a late
        delivery of its message counts nothing more), and the workers' set of its skips is
        dropped unless the job recorded a failure."""
        finish_job(self.client, job_id)

    def delete(self, job_id: str) -> None:
        """The job's keys and its entry in the index of jobs, together."""
        keys = (
            backfill_state_key(job_id),
            backfill_runs_key(job_id),
            backfill_traces_key(job_id),
            backfill_rootless_key(job_id),
            backfill_jobs_key(),
        )
        checked(self.client, _WHERE, [], lambda: self._delete(keys=keys, args=(job_id,)))


class JobHold:
    """One process at a time on a job: its start or a ``--resume`` holds a Redis lock (redis-py's,
    renewed every third of ``HOLD_S`` while it runs). Two resumes of one job at once both
    enqueued its runs, and each ended "finished" with the other's scores counted against its own
    expected ones. The lock names its holder (host, PID namespace, pid): one that died here (a
    SIGKILLed backfill resumed at once) is taken over at once, one elsewhere when it lapses."""

    HOLD_S = 30.0
    _DELETE_IF = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"

    def __init__(self, client: Any, job_id: str) -> None:
        self._client = client
        self.key = backfill_hold_key(job_id)
        self._lock = client.lock(self.key, timeout=self.HOLD_S, blocking=False, thread_local=False)
        self.token = f"{_this_host()}:{os.getpid()}:{secrets.token_hex(8)}"
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        # Set when a renewal finds the lock another's (it lapsed: Redis lost it, or this process
        # was paused past HOLD_S): the job must stop, another process may be running it.
        self.lost = threading.Event()

    def acquire(self, wait_s: float = 0.0, on_wait: Callable[[], None] | None = None) -> bool:
        """True once held; waits up to ``wait_s`` for another holder's lock to lapse (``on_wait``
        called once, when it starts waiting)."""
        deadline = time.monotonic() + wait_s
        waiting = False
        while not self._lock.acquire(token=self.token):
            if self._holder_died_here():
                continue
            if time.monotonic() >= deadline:
                return False
            if not waiting and on_wait is not None:
                on_wait()
            waiting = True
            time.sleep(0.5)
        self._renewer = threading.Thread(target=self._renew, name="tracescore-backfill-hold", daemon=True)
        self._renewer.start()
        return True

    def _holder_died_here(self) -> bool:
        """Whether the holder was a process of this host that is gone (its lock then removed),
        or there is none now (it lapsed meanwhile, or the key was of another type: repaired)."""
        held = self._holder()
        if held is None:
            return True
        host, _, pid = (held or "").rpartition(":")[0].rpartition(":")
        if host != _this_host() or not pid.isdecimal() or int(pid) == os.getpid():
            return False
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return bool(self._client.eval(self._DELETE_IF, 1, self.key, held))
        except PermissionError:  # alive, another user's
            return False
        return False

    def _holder(self) -> str | None:
        # A hold of another type is one no process could ever take or release (redis-py's SET NX
        # only fails on it): it guards no data, so it is repaired (deleted, counted).
        where = "backfill_hold"
        raw = checked(self._client, where, [(self.key, "string", False)], lambda: self._client.get(self.key))
        return raw.decode(errors="replace") if isinstance(raw, bytes) else raw

    def confirm(self) -> bool:
        """Whether the hold is still this process's (asked of Redis; marked lost when not). A
        Redis that does not answer says nothing: the write that follows fails on its own."""
        import redis

        try:
            if self._holder() == self.token:
                return True
        except redis.exceptions.RedisError:
            return True
        self.lost.set()
        return False

    def _renew(self) -> None:
        import redis

        while not self._stop.wait(self.HOLD_S / 3):
            try:
                self._lock.extend(self.HOLD_S, replace_ttl=True)
            except redis.exceptions.LockNotOwnedError:
                self.lost.set()
                return
            except redis.exceptions.RedisError:  # away now: the next renewal may land
                continue

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(5)
        import redis

        with contextlib.suppress(redis.exceptions.RedisError):  # (LockError among them) it lapses by itself
            self._lock.release()


def _this_host() -> str:
    """This host, as a holder's pid means something on it: the host name and the PID namespace
    (containers sharing a host name, on the host's network, each have their own pids)."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return f"{socket.gethostname()}/{namespace}"
