"""Every Redis key tracescore uses, in one place. All start with ``tracescore:``."""

from __future__ import annotations

__all__ = [
    "PREFIX",
    "backfill_hold_key",
    "backfill_jobs_key",
    "backfill_rootless_key",
    "backfill_runs_key",
    "backfill_state_key",
    "backfill_traces_key",
    "checkpoint_key",
    "claim_key",
    "delivery_key",
    "dlq_bytes_key",
    "dlq_bytes_sum_key",
    "dlq_held_key",
    "dlq_key",
    "dlq_reasons_key",
    "dlq_seen_key",
    "dlq_taken_key",
    "failures_key",
    "job_budget_key",
    "job_key",
    "job_spend_key",
    "job_uncounted_key",
    "judge_calls_key",
    "limiter_bucket_key",
    "limiter_granted_key",
    "limiter_pause_key",
    "limiter_prefix",
    "outbox_attempts_key",
    "outbox_counts_key",
    "outbox_dead_key",
    "outbox_dead_order_key",
    "outbox_key",
    "outbox_sinks_key",
    "record_key",
    "spend_key",
    "spend_write_key",
    "trace_key",
]

PREFIX = "tracescore:"


def claim_key(score_id: str) -> str:
    """Held by the worker scoring ``score_id`` right now (SET NX with a TTL)."""
    return f"{PREFIX}claim:{score_id}"


def record_key(score_id: str) -> str:
    """The stored ``ScoreRecord`` JSON; its presence means "scored, do not score again"."""
    return f"{PREFIX}score:{score_id}"


def trace_key(trace_id: str) -> str:
    """Set of score ids recorded for one trace (``tracescore scores --trace``)."""
    return f"{PREFIX}trace:{trace_id}"


def checkpoint_key(score_id: str) -> str:
    """The partial ``ScoreResult`` after the last completed step."""
    return f"{PREFIX}checkpoint:{score_id}"


def job_key(job_id: str) -> str:
    """Hash of per-job counters: scored, failed, skipped, failed:<reason>."""
    return f"{PREFIX}job:{job_id}"


def job_skips_key(job_id: str) -> str:
    """Set of the score ids a job counted as skipped because another job (or live traffic)
    scored them: each counted once, however often its message is retried."""
    return f"{PREFIX}job-skips:{job_id}"


def job_uncounted_key(job_id: str) -> str:
    """Set of the score ids whose record a job stored after it finished, not counted (a late
    delivery of a score it had counted): replaced later, such a record has no count to move."""
    return f"{PREFIX}job-uncounted:{job_id}"


def dlq_key() -> str:
    """List of dead letters (JSON), newest first."""
    return f"{PREFIX}dlq"


def dlq_bytes_key() -> str:
    """String: the bytes of the dead letters on the list (their JSON), kept in step with it by
    every push and take, for its byte bound; summed again from the list when lost or damaged."""
    return f"{PREFIX}dlq:bytes"


def dlq_bytes_sum_key() -> str:
    """Hash: while the letters' bytes are summed again from the list (a page per script, from the
    oldest), ``read`` (the oldest letters summed so far) and ``sum`` (their bytes); ``trusted``
    while the count is right but past the bound (a bound lowered: the oldest go a step per script)."""
    return f"{PREFIX}dlq:bytes:sum"


def dlq_seen_key(message_key: str) -> str:
    """Set (with a TTL) once a message was dead-lettered, so a redelivery of the same message
    (a consumer restart before its ack) never becomes a second dead letter."""
    return f"{PREFIX}dlq:seen:{message_key}"


def dlq_held_key(letter_id: str) -> str:
    """Set (with a TTL) while one ``dlq retry`` sends the letter back, so a second one running at
    the same time does not send it too."""
    return f"{PREFIX}dlq:held:{letter_id}"


def dlq_taken_key(letter_id: str) -> str:
    """Set (with a TTL) by the take that removed the letter, to that take's nonce: the same take
    sent again (its reply lost to a Redis restart, the client retrying) finds the letter gone and
    reads here that it was its own."""
    return f"{PREFIX}dlq:taken:{letter_id}"


def dlq_reasons_key() -> str:
    """Hash: dead-letter reason → letters on the list with that reason (``tracescore status``)."""
    return f"{PREFIX}dlq:reasons"


def dlq_dropped_key() -> str:
    """Hash: dead letters dropped past the list's bound (the oldest first), by reason."""
    return f"{PREFIX}dlq:dropped"


def failures_key(bucket: int) -> str:
    """Hash of failure counts by reason in one time bucket (``worker.store._jobs.failure_bucket``), for
    ``tracescore status``."""
    return f"{PREFIX}failures:{bucket}"


def limiter_bucket_key(model_id: str, kind: str) -> str:
    """Token bucket of one judge model; ``kind`` is ``req`` or ``tok``."""
    return f"{limiter_prefix()}{kind}:{model_id}"


def limiter_pause_key(model_id: str) -> str:
    """Set (with a TTL) while a provider asked us to back off from ``model_id``."""
    return f"{limiter_prefix()}pause:{model_id}"


def delivery_key(task_id: str) -> str:
    """How many times one queue message (task id; retries keep it) was delivered."""
    return f"{PREFIX}delivery:{task_id}"


def limiter_prefix() -> str:
    """What every limiter key starts with (``tracescore status`` scans them)."""
    return f"{PREFIX}limiter:"


def limiter_granted_key(model_id: str) -> str:
    """Hash: epoch second → judge calls admitted in that second (kept one hour)."""
    return f"{limiter_prefix()}granted:{model_id}"


def spend_key(day: str) -> str:
    """Hash: judge spend (USD) of one UTC day by ``scorer:<id>``, ``model:<id>`` and ``total``."""
    return f"{PREFIX}spend:{day}"


def job_spend_key(job_id: str) -> str:
    """Hash: judge spend (USD) of one backfill job by ``scorer:<id>``, ``model:<id called>`` and
    ``total``, and its judge calls: ``calls`` (every one sent), ``unpriced:<model>``."""
    return f"{PREFIX}spend:job:{job_id}"


def spend_write_key(write_id: str) -> str:
    """String: the mark of one judge call's spend write, set by the write itself (kept a minute):
    the same write sent again after a lost reply finds it and adds nothing."""
    return f"{PREFIX}spend-write:{write_id}"


def job_budget_key(job_id: str) -> str:
    """A backfill job's ``--max-cost`` (USD)."""
    return f"{PREFIX}budget:job:{job_id}"


def judge_calls_key(run_key: str) -> str:
    """Failed judge calls of one run (``trace:span:scorer``) across its deliveries: a hash,
    field ``<version>`` the count (HINCRBY), ``<version>:error`` the last error; with a TTL."""
    return f"{PREFIX}judge_calls:{run_key}"


def backfill_state_key(job_id: str) -> str:
    """A backfill job's resumable state (JSON: source, options, per-source progress)."""
    return f"{PREFIX}backfill:{job_id}"


def backfill_traces_key(job_id: str) -> str:
    """Set of trace ids a backfill job of an earlier release enqueued: read (never written) when
    such a job is resumed, so it still enqueues none of them twice (``backfill_runs_key`` now)."""
    return f"{PREFIX}backfill:{job_id}:traces"


def backfill_hold_key(job_id: str) -> str:
    """The lock of the process running a backfill job (its start or a ``--resume``), renewed while
    it runs: a second process on the job is refused."""
    return f"{PREFIX}backfill-hold:{job_id}"


def backfill_jobs_key() -> str:
    """Sorted set of backfill job ids by their start (epoch s), added to by each save of a job's
    state (in the same script), so ``tracescore status`` lists the jobs with ZRANGE, never a SCAN
    of the keyspace; it removes an id whose state expired when it reads it. Not under
    ``backfill:``, as ``backfill_runs_key``."""
    return f"{PREFIX}backfill-jobs"


def backfill_runs_key(job_id: str) -> str:
    """Set of runs (``<trace id>:<target span id>``) a backfill job has enqueued, so the job never
    enqueues one twice (a resume reading again, an input read twice). Not under
    ``backfill:<job id>:``: scripts find job states with ``backfill_state_key("*")``."""
    return f"{PREFIX}backfill-runs:{job_id}"


def backfill_rootless_key(job_id: str) -> str:
    """List of the traces a backfill job read (oldest first, the newest kept as the job's
    assembler keeps them; ``r:<trace id>`` for one read with its root, the bare id for one read
    without it, all an earlier release kept, hence the name): its ``--resume`` takes a span or
    root of one of them that comes past the checkpoint as the late span or root it is, not as a
    new trace."""
    return f"{PREFIX}backfill-rootless:{job_id}"


def outbox_key(sink: str) -> str:
    """Sorted set of score ids one sink still has to take, scored by when (epoch ms) each is due
    next: when it was stored, when a drainer's lease on it runs out, or its next retry."""
    return f"{PREFIX}outbox:{sink}"


def outbox_attempts_key(sink: str) -> str:
    """Hash: score id → how many times one sink's drainers took it (survives a crash)."""
    return f"{PREFIX}outbox:{sink}:attempts"


def outbox_counts_key(sink: str) -> str:
    """Hash of one sink's counters: delivered, dropped, retried."""
    return f"{PREFIX}outbox:{sink}:counts"


def outbox_dead_key(sink: str) -> str:
    """Hash: score id → the sink's dead letter (JSON) for a score it refused or never took."""
    return f"{PREFIX}outbox:{sink}:dead"


def outbox_dead_order_key(sink: str) -> str:
    """Sorted set: score id → when (epoch ms, its letter's ``failed_at``) it became the sink's
    dead letter: the order the bound (``TRACESCORE_SINK_MAX_DEAD_LETTERS``) drops the oldest by.
    Kept in step with ``outbox_dead_key`` by every script that adds or removes a letter; a letter
    without an entry (written by a release before it) is ordered when the bound needs it."""
    return f"{PREFIX}outbox:{sink}:dead:order"


def outbox_sinks_key() -> str:
    """Set of the sink names workers have drained (``tracescore status`` lists them)."""
    return f"{PREFIX}outbox:sinks"
