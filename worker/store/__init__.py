"""Where the workers keep state, split by job; each part is a protocol with a Redis
implementation (shared by every worker and the CLI) and an in-memory twin (the embedded mode,
tests).

- ``ScoreStore``: the exactly-once core — score records (the first writer wins), claims and
  their owners (``claim`` takes over those of a dead local process), step checkpoints.
- ``DeliveryLog``: which deliveries of a queue message began and never ended (their process
  died), so that a message that kills its workers is split and dead-lettered (Redis only: the
  Celery task is its one user).
- ``DeadLetters``: messages that could not be scored, one letter per queue message, counted by
  reason.
- ``Outbox``: stored score records waiting for each configured sink (queued by ``put_records``
  in the same atomic step), drained by leases, with per-sink counts and dead letters.
- ``JobStats``: per-job counters and recent failures; a store's ``jobs`` are the statistics its
  recorded scores are counted into, atomically with the record.

The Redis implementations reconnect by themselves (a Redis restart, a failover) and retry the
command; when Redis stays away they raise ``StoreUnavailableError``, which hands a task's
message back to the queue. A key of theirs holding another Redis type is repaired (state they
can rebuild; counted in ``tracescore_store_key_repairs_total``) or refused with
``StoreKeyTypeError`` (dead letters, a sink's undelivered scores, what a job counted), the same way on every path
(``worker.store._keytypes``; ``checked`` / ``checked_async`` for a caller's own commands on keys it
owns, ``checked_script`` for its scripts: the judge limiter's buckets, the spend ledger). A hash of
counters is read with ``known_counters`` (a value that is not a number is None: unknown) or
``read_counters`` (left out), each logged and counted; a script adding to one repairs it first
(``tracescore_check_counters``: named ``<key> <field>``; a job's count is kept aside, and its
progress refused: ``UnreadableCounterError``).
"""

from worker._reconnect import StoreUnavailableError
from worker.store._dead_letters import (
    DeadLetter,
    DeadLetters,
    RedisDeadLetters,
    SyncRedisDeadLetters,
    dead_letter_id,
    letters_bytes,
)
from worker.store._deliveries import END_WAIT_S, DeliveryLog, new_token
from worker.store._jobs import JobStats, RedisJobStats, finish_job, job_counts, job_progress
from worker.store._keytypes import (
    UNACKED_MUTEX_EXPIRE_S,
    StoreKeyTypeError,
    check_list,
    checked,
    checked_async,
    checked_script,
    release_stuck_lock,
)
from worker.store._memory import MemoryDeadLetters, MemoryJobStats, MemoryScoreStore
from worker.store._outbox import Lease, MemoryOutbox, Outbox, RedisOutbox, SinkCounts, SinkDeadLetter, SinkState
from worker.store._redis import failed_fields, known_counters, read_counters, validation_place
from worker.store._scores import Claims, RedisScoreStore, ScoreStore, claim, delivery_owner, process_owner

__all__ = [
    "END_WAIT_S",
    "UNACKED_MUTEX_EXPIRE_S",
    "Claims",
    "DeadLetter",
    "DeadLetters",
    "DeliveryLog",
    "JobStats",
    "Lease",
    "MemoryDeadLetters",
    "MemoryJobStats",
    "MemoryOutbox",
    "MemoryScoreStore",
    "Outbox",
    "RedisDeadLetters",
    "RedisJobStats",
    "RedisOutbox",
    "RedisScoreStore",
    "ScoreStore",
    "SinkCounts",
    "SinkDeadLetter",
    "SinkState",
    "StoreKeyTypeError",
    "StoreUnavailableError",
    "SyncRedisDeadLetters",
    "check_list",
    "checked",
    "checked_async",
    "checked_script",
    "claim",
    "dead_letter_id",
    "delivery_owner",
    "failed_fields",
    "finish_job",
    "job_counts",
    "job_progress",
    "known_counters",
    "letters_bytes",
    "new_token",
    "process_owner",
    "read_counters",
    "release_stuck_lock",
    "validation_place",
]
