"""The worker's exception tree, grouped by who must handle the error.

    WorkerError                         anything worker/ raises on purpose         category
    ├── SettingsError (ValueError)      a TRACESCORE_* variable the worker cannot
    │                                   use (the operator fixes the environment)   config
    ├── RegistryError                   the scorer module cannot be loaded or has
    │                                   no usable scorers                          config
    ├── UnknownScorerError (KeyError)   a message names a scorer id this worker
    │                                   does not have (deploy the same module)     config
    ├── StoreUnavailableError           Redis stayed unreachable through every
    │   (a celery Reject and a redis    reconnect: the message goes back to the
    │    ConnectionError)               queue                                      retryable
    ├── BrokerUnwritableError           the broker's Redis refuses writes for now
    │   (a redis ConnectionError)       (full, or a read-only replica in a
    │                                   failover): kombu and Celery wait as for a
    │                                   lost connection                            retryable
    ├── StoreKeyTypeError               a key holding what someone may need (dead
    │                                   letters, undelivered scores, what a job
    │                                   counted, spend) is of another Redis type:
    │   │                               left for the operator                      config
    │   └── UnreadableCounterError      a count of a job held no integer: kept
    │                                   aside, its count started over, the job's
    │                                   counts unknown until the operator sets
    │                                   it right (its scores still stored)         config
    ├── UnreadableStateError            a backfill job's state is no state this
    │                                   release reads: left for the operator       config
    ├── ScorerClosedError (ValueError)  an ``EmbeddedScorer`` given work once it
    │                                   was closed (an app's ``embedded_sink``
    │                                   handed a batch as its exporter shut down,
    │                                   or once the app closed it): refused for
    │                                   good, not scored                           internal
    ├── StepExitError (ScorerError)     a scorer's step called ``sys.exit``: the
    │                                   run's failure (final: it would again)      internal
    ├── RunLimitError (ScorerError)     a run hit a limit: ``error_type`` timeout
    │                                   or memory (final: it would do it again)    timeout | memory
    └── LoopBlockedError                the loop watchdog's exception, raised into
                                        the code blocking the loop: the run's
                                        timeout where it was aimed, elsewhere a
                                        run failed through no fault of its own     retryable

``category`` is the scorers' ``ErrorCategory``, decided per class here; a failed run's is its
``ScorerRunError.category`` (``scorers``: one status table shared with the judge's retries).
The worker decides "retry this run later" by reading ``category`` only (``is_transient``).
Redis errors are translated into ``StoreUnavailableError`` in one place, the reconnecting
client (``worker._reconnect.unavailable_as_error``). The two that are also Redis and Celery
errors are defined beside the code that raises them (``StoreUnavailableError`` in
``worker._reconnect``, ``BrokerUnwritableError`` in ``worker._guard``), so that what loads this
module (the settings: every command and probe) does not load redis-py and Celery.
``worker.cli.CliError`` is not part of this tree: it is how the command line shows any error
(one line, an exit code).
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from scorers import ScorerError, ScoreResult, category_of

if TYPE_CHECKING:
    from scorers.judge import ErrorCategory

_E = TypeVar("_E", bound=BaseException)

__all__ = [
    "LoopBlockedError",
    "RegistryError",
    "RunLimitError",
    "ScorerClosedError",
    "SettingsError",
    "StepExitError",
    "StoreKeyTypeError",
    "UnknownScorerError",
    "UnreadableCounterError",
    "UnreadableStateError",
    "WorkerError",
    "caused_by",
    "crash_fields",
    "is_transient",
]


def is_transient(exc: BaseException | None) -> bool:
    """Worth another delivery later: the error's ``category`` is ``retryable`` (timeouts,
    connection errors, 408/409/425/429/5xx from a provider, Redis away)."""
    return exc is not None and category_of(exc) == "retryable"


def caused_by(exc: BaseException | None, types: type[_E] | tuple[type[_E], ...]) -> _E | None:
    """The first error of ``types`` that ``exc`` is or was caused by, however wrapped: through
    ``__cause__``, ``__context__`` and a ``cause`` attribute (a scorer's failed step keeps the
    error it caught there), each error looked at once (a chain may loop)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, types):
            return current
        # Reversed onto the stack: the explicit cause first, the context last.
        todo += [current.__context__, current.__cause__, getattr(current, "cause", None)]
    return None


def crash_fields(exc: BaseException) -> dict[str, Any]:
    """A crash for the log: its type and stack (code locations and lines), not its text, which
    may quote the run (a KeyError of a message key, a scorer's own f-string of the answer).
    The score record still carries the text, for whoever reads the scores."""
    frames = traceback.extract_tb(exc.__traceback__)
    return {
        "error_type": type(exc).__name__,
        # Not "stack": structlog's renderers take that key for a formatted stack_info string.
        "frames": [f"{f.filename}:{f.lineno} in {f.name}: {f.line or ''}" for f in frames[-8:]],
    }


class WorkerError(Exception):
    """Base of the errors worker/ raises on purpose."""

    _category: ClassVar[ErrorCategory] = "internal"

    @property
    def category(self) -> ErrorCategory:
        """What kind of failure this is (see ``scorers.judge.ErrorCategory``)."""
        return self._category


class SettingsError(WorkerError, ValueError):
    """A ``TRACESCORE_*`` environment variable holds a value the worker cannot use."""

    _category: ClassVar[ErrorCategory] = "config"


class RegistryError(WorkerError):
    """The scorer module cannot be loaded or defines no usable scorers."""

    _category: ClassVar[ErrorCategory] = "config"


class UnknownScorerError(WorkerError, KeyError):
    """A message names a scorer id the registry does not have."""

    _category: ClassVar[ErrorCategory] = "config"

    def __init__(self, scorer_id: str, known: Iterable[str]) -> None:
        known_ids = sorted(known)
        super().__init__(scorer_id)
        self.scorer_id = scorer_id
        self.message = f"unknown scorer id {scorer_id!r}; this worker knows: {', '.join(known_ids) or '(none)'}"

    def __str__(self) -> str:
        return self.message


class StoreKeyTypeError(WorkerError):
    """A key holding what someone may need (dead letters, undelivered scores, what a job
    counted, what was spent) is of another Redis type than the store keeps there; it is left as
    it is for the operator."""

    _category: ClassVar[ErrorCategory] = "config"

    def __init__(self, key: str, found: str, expected: str) -> None:
        self.key, self.found, self.expected = key, found, expected
        self.message = (
            f"Redis key {key} holds a {found}, where tracescore keeps a {expected} it cannot rebuild; "
            "it is left as it is: rename it aside (or delete it if nothing in it is needed)"
        )
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.found, self.expected))


class UnreadableCounterError(StoreKeyTypeError):
    """A count in a job's hash of counters held no integer (written by hand, another program): a
    script adding to it kept what it held aside and started the count over, so the job's scores
    are still stored and counted, but its counts are unknown until an operator sets the count
    right and deletes the fields kept. ``kept``: the fields keeping the values it held, the first
    few times (``worker.store._keytypes``); ``counted``: the field counting them ("" if none);
    ``times``: how many it held. Raised by the job's progress (a backfill waiting for its total
    would wait for good). Names the key and the fields, never a value."""

    def __init__(self, key: str, field: str, kept: tuple[str, ...], counted: str, times: int) -> None:
        super().__init__(key, "hash", "hash")
        self.field, self.kept, self.counted, self.times = field, kept, counted, times
        self.message = (
            f"Redis key {key}: its count {field} held no integer {self.found_times()}, kept as found in"
            f" {self.kept_where()}; the count started over{' each time' * (times > 1)}, so the job's counts are"
            f" unknown: {self.repair()}"
        )
        self.args = (self.message,)

    def found_times(self) -> str:
        return "once" if self.times == 1 else f"{self.times} times"

    def kept_where(self) -> str:
        """Where the values it held are kept, and their count."""
        where = f"field{'s' * (len(self.kept) > 1)} {' '.join(self.kept)}" if self.kept else "no field (deleted)"
        if self.counted:
            where += f" (counted in field {self.counted})"
        if 0 < len(self.kept) < self.times:
            # (the first few kept: past them only counted; or an operator deleted some of them)
            where += f"; {len(self.kept)} of the {self.times} values found are kept"
        return where

    def repair(self) -> str:
        """What the operator does: the count set right, every field kept deleted, and how to find
        another count of the job's kept aside (each is refused in turn)."""
        fields = " ".join((*self.kept, self.counted) if self.counted else self.kept)
        return (
            f"set it right (HINCRBY {self.key} {self.field} <the count it lost>), delete the fields kept"
            f" (HDEL {self.key} {fields}); HSCAN {self.key} 0 MATCH unreadable:* lists every field kept"
            " aside (another count's too)"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.field, self.kept, self.counted, self.times))


class UnreadableStateError(WorkerError):
    """A backfill job's state key holds a string that is no job state this release reads (not
    JSON, or JSON of another shape): left as it is for the operator. Names the key and the first
    problem's place, never the value (an agent's text, a secret)."""

    _category: ClassVar[ErrorCategory] = "config"

    def __init__(self, key: str, problem: str) -> None:
        self.key, self.problem = key, problem
        super().__init__(f"{key} is not a job state this release reads ({problem})")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.problem))


class ScorerClosedError(WorkerError, ValueError):
    """An ``EmbeddedScorer`` was given work (a batch, runs) after it stopped taking any: it
    closed, or an app's ``embedded_sink`` is closing with its exporter. Nothing of it is scored;
    who handed it over names it as not scored. A ``ValueError``: the exporter's sender takes it
    as the sink refusing the batch for good (counted as ``send_failed``, not retried: a closed
    scorer refuses every try alike)."""

    def __init__(self) -> None:
        super().__init__("the in-process scorer was closed: nothing handed to it now is scored")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), ())


class RunLimitError(ScorerError, WorkerError):
    """A scorer run hit a limit: ``error_type`` is ``timeout`` (past the run timeout, cancelled or
    interrupted) or ``memory`` (``MemoryError``). Final: the same run would do it again."""

    def __init__(self, message: str, *, error_type: str, failed_step: str | None = None) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.failed_step = failed_step
        self.partial: ScoreResult | None = None

    @property
    def category(self) -> ErrorCategory:
        return "memory" if self.error_type == "memory" else "timeout"


class LoopBlockedError(WorkerError):
    """Raised inside code that kept the worker's event loop busy past the run timeout.

    It is raised asynchronously (a class, without arguments), so the message is fixed here.
    Only in the task the watchdog targeted (``was_targeted``) is it the run's timeout; if the
    step returned just before it fired, it may land in another run, which then failed through
    no fault of its own: retryable."""

    _category: ClassVar[ErrorCategory] = "retryable"

    def __init__(self, *args: object) -> None:
        super().__init__(
            *(args or ("the step kept the worker's event loop blocked past TRACESCORE_RUN_TIMEOUT_SECONDS",))
        )


class StepExitError(ScorerError, WorkerError):
    """A scorer's step called ``sys.exit`` (a library's command-line error path does). Steps run
    on the worker's loop thread, where a ``SystemExit`` would end that thread and leave whoever
    waits for the run, the batch or the command, waiting: it is the run's failure instead."""

    error_type = "SystemExit"

    def __init__(
        self, scorer_id: str, code: object, failed_step: str | None = None, partial: ScoreResult | None = None
    ) -> None:
        # (kept as text unless a number: the exit code may be any object, and this must pickle)
        code = code if code is None or isinstance(code, int | str) else repr(code)
        where = f"step {failed_step}" if failed_step else "a step"
        super().__init__(
            f"scorer {scorer_id!r} called sys.exit({code!r}) in {where}; a step fails its run by raising an exception"
        )
        self.scorer_id, self.code = scorer_id, code
        self.failed_step = failed_step
        # What the run's finished steps spent (its judge calls), recorded with the failure.
        self.partial = partial if isinstance(partial, ScoreResult) else None

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.scorer_id, self.code, self.failed_step, self.partial))
