"""The Celery app: JSON only, late acks, prefetch 1, time limits inside the visibility timeout.

``create_app(settings)`` builds an app from one ``Settings`` object, which the app then hands
to everything it runs (the task's runtime, the message guard, the broker transport): nothing
reads or rewrites the environment after that. ``tracescore worker`` builds its Settings from
its options and calls it; the module-level ``app`` (``celery -A worker worker``) is the
environment's app: its settings are ``TRACESCORE_*``, read once per process, and a bad value
is reported when a worker starts (importing ``worker`` never fails on one).

SIGTERM (Celery's warm shutdown: no new messages, running tasks awaited without a limit) gets a
deadline here: each process running tasks (this one in the threads and solo pools; each child,
told by SIGUSR2, in the prefork pool) lets its batches run for ``TRACESCORE_SHUTDOWN_GRACE_SECONDS``,
then cancels them (claims released) and requeues their messages (``worker._task``), so the
worker exits within the grace period plus a few seconds and another one finishes the work.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import sys
import threading
from typing import Any

import click
import redis
import structlog
from celery import Celery, Task, bootsteps, signals
from redis.exceptions import AuthenticationError, ResponseError

from tracing import redact
from worker import _heartbeat as probe_files
from worker._gc import freeze_startup_objects
from worker._logs import configure_logs
from worker._settings import (
    NO_BROKER,
    SCREENED_BROKER_SCHEMES,
    TLS_TO_PLAIN,
    Settings,
    SettingsError,
    get_settings,
    load_settings,
    missing_database,
    silent_to_tls,
)
from worker.metrics import MetricsStep

__all__ = [
    "TracescoreApp",
    "app",
    "check_connections",
    "configure_app",
    "create_app",
    "redact",
    "score_batch_task",
]

log = structlog.get_logger("tracescore.worker")


class _RequeueWithoutTraceback(logging.Filter):
    """Celery logs a task that raised ``Reject`` at WARNING with its traceback. tracescore's task
    rejects only to requeue (the broker or the store away, a shutdown, a hard time limit:
    worker/_task.py), and its reason, in the line, names the cause; a traceback there read like a
    crash to operators. Other records pass as they are."""

    def filter(self, record: logging.LogRecord) -> bool:
        data = getattr(record, "data", None)
        if isinstance(data, dict) and data.get("description") == "rejected":
            record.exc_info = None
            record.exc_text = None
        return True


# (Celery's task tracer logs through this logger, in whichever process runs the task.)
logging.getLogger("celery.app.trace").addFilter(_RequeueWithoutTraceback())
configure_logs()

_AUTH_REPLIES = ("WRONGPASS", "NOAUTH", "AUTH")


class TracescoreApp(Celery):
    """A Celery app that knows the ``Settings`` it was created with."""

    score_batch_task: Task[Any, Any]

    def __init__(self, settings: Settings | None) -> None:
        super().__init__("tracescore", set_as_current=False)
        self._settings = settings

    @property
    def settings(self) -> Settings:
        """The app's settings; the environment's app reads ``TRACESCORE_*`` once per process
        (a bad value raises ``SettingsError`` here, when a worker or task first needs them)."""
        return self._settings if self._settings is not None else get_settings()

    def use_scorers(self, module: str) -> None:
        """The worker's ``--scorers`` option: the same settings with this scorer module."""
        if self._settings is None:
            self._settings = load_settings(scorers=module)
        else:
            self._settings = self._settings.model_copy(update={"scorers": module})
        configure_app(self, self._settings)


# How often kombu checks the broker's long-lived connections (the wait for a message, the
# broadcasts) and redis-py pings a pooled connection idle this long before using it. kombu's
# default (25 s) found a half-open wait only after up to 51 s.
BROKER_HEALTH_CHECK_S = 10


def configure_app(app: Celery, settings: Settings) -> None:
    """Apply ``settings`` to ``app``'s Celery configuration."""
    from worker._guard import MAX_ENTRY_BYTES_OPTION, envelope_limit
    from worker._reconnect import COMMAND_SLACK_S

    app.conf.update(
        broker_url=settings.broker_url,
        # rediss:// verifies the certificate (kombu alone would not); None for redis://
        broker_use_ssl=settings.tls.kombu_ssl(settings.broker_url),
        broker_connection_retry_on_startup=True,
        accept_content=["json"],
        task_serializer="json",
        result_serializer="json",
        event_serializer="json",
        result_accept_content=["json"],
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # A hard time limit hands the message back (requeue) instead of acking it; the task turns
        # its own infrastructure failures into Reject(requeue=True) (worker/_task.py).
        task_acks_on_failure_or_timeout=False,
        # A retry republishes the message before the delivery is acked. Celery's default publish
        # retry gives up after ~0.6 s and then discards the delivery (Reject(requeue=False)): a
        # broker restart mid-retry would lose the batch. Ride out a restart instead.
        task_publish_retry=True,
        task_publish_retry_policy={"max_retries": 30, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 2},
        worker_prefetch_multiplier=1,
        # On a lost broker connection the running batches go on (their claims keep a redelivery
        # from paying twice); cancelling them would throw away judge calls already paid for.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        task_soft_time_limit=settings.task_soft_time_limit,
        task_time_limit=settings.task_time_limit,
        task_default_queue=settings.queue,
        task_create_missing_queues=True,
        worker_hijack_root_logger=False,
        # structlog writes its own lines; Celery would re-log them as WARNING otherwise.
        worker_redirect_stdouts=False,
        worker_send_task_events=False,
        broker_transport_options={
            # Longer than the longest task, so Redis never hands a running task to a second worker.
            "visibility_timeout": settings.visibility_timeout,
            "unacked_restore_interval": settings.unacked_restore_interval,
            "unacked_restore_throttle": settings.unacked_restore_throttle,
            # A failover can leave the broker connections half-open (the old primary gone without
            # a reset, or frozen): no reply ever comes and nothing fails. kombu drops a wait for a
            # message whose reply is overdue (health_check_interval), but only from the event
            # loop, and a command the loop sends itself (the unacked sweep's script, an ack) waited
            # on such a connection forever: the worker consumed nothing and logged nothing. Each
            # command now ends within COMMAND_SLACK_S (as the score store's), and the overdue
            # wait is dropped within brpop_timeout + 2 x BROKER_HEALTH_CHECK_S (21 s).
            "socket_timeout": COMMAND_SLACK_S,
            "health_check_interval": BROKER_HEALTH_CHECK_S,
            # read by the guarded channel (kombu ignores options it does not know)
            MAX_ENTRY_BYTES_OPTION: envelope_limit(settings.max_payload_bytes),
        },
    )
    # Every message is screened before Celery decodes it; refusals are dead letters (_guard.py).
    app.conf.worker_consumer = "worker._guard:GuardedConsumer"
    if settings.broker_url.partition("://")[0].lower() in SCREENED_BROKER_SCHEMES:  # (Settings refuses others)
        app.conf.broker_transport = "worker._guard:GuardedRedisTransport"


def create_app(settings: Settings | None) -> TracescoreApp:
    """A Celery app for ``settings`` with the scoring task, the message guard and the worker's
    start-up checks; ``None`` is the environment's settings (the module-level ``app``)."""
    from worker._task import register_score_task

    app = TracescoreApp(settings)
    try:
        initial = app.settings
    except SettingsError:
        # Reported when a worker starts (ScorersOption); importing must not fail, or even
        # `tracescore --help` would.
        initial = Settings.model_construct()
    configure_app(app, initial)
    app.user_options["worker"].add(
        click.Option(["--scorers"], default=None, help="Module that defines the scorers, e.g. my_app.scorers.")
    )
    app.steps["worker"].add(ScorersOption)
    app.steps["worker"].add(MetricsStep)  # the node's /metrics and OTLP metrics (worker.metrics)
    app.steps["consumer"].add(ProbeFiles)
    app.score_batch_task = register_score_task(app)
    return app


def check_connections(settings: Settings, timeout_s: float = 5.0) -> None:
    """Fail fast on what no retry can fix: a refused password, a TLS certificate that does not
    verify, or a ``rediss://`` port that takes the connection but never answers TLS (a plain
    Redis), on the broker or the score store (``SettingsError``). A broker that is merely
    down or does not answer in ``timeout_s`` (a stalled Redis, packets dropped on the way, a
    Service whose pod is not ready) is left to Celery, which waits for it to come up; a store
    away is left to its clients, which reconnect (a task meanwhile hands its message back). An
    empty broker URL (embedded mode) is refused: Celery would fall back to an unscreened AMQP
    broker on localhost."""
    if not settings.broker_url:
        raise SettingsError(
            f"{NO_BROKER}: a worker takes its messages from Redis; set it or pass --broker redis://HOST:6379/0"
        )
    targets: list[tuple[str, str, dict[str, Any]]] = [
        ("broker", settings.broker_redis_url, settings.tls.redis_kwargs(settings.broker_url)),
    ]
    if settings.store_url != settings.tls.url(settings.broker_redis_url):
        targets.append(("score store", settings.store_url, {}))  # its URL carries the TLS options
    for what, url, tls_kwargs in targets:
        if not url.startswith(("redis://", "rediss://", "unix://")):
            continue
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s, **tls_kwargs)
        try:
            client.ping()
        except (AuthenticationError, ResponseError) as exc:
            if isinstance(exc, AuthenticationError) or any(r in str(exc) for r in _AUTH_REPLIES):
                raise SettingsError(
                    f"the {what} at {redact(url)} refused the credentials (authentication failed: "
                    f"{redact(str(exc))}); fix the password in "
                    f"{'--broker or TRACESCORE_BROKER_URL' if what == 'broker' else 'TRACESCORE_REDIS_URL'}"
                ) from None
            if "DB index is out of range" in str(exc):  # (Celery retried it for good, as a broker down)
                raise SettingsError(
                    missing_database(
                        what, url, "--broker or TRACESCORE_BROKER_URL" if what == "broker" else "TRACESCORE_REDIS_URL"
                    )
                ) from None
            # any other reply means the server is there and talking: Celery takes it from here
        except redis.ConnectionError as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(exc):
                raise SettingsError(
                    f"the {what}'s TLS certificate at {redact(url)} did not verify ({redact(str(cause or exc))}): "
                    "set TRACESCORE_BROKER_CA_FILE to the PEM of the CA that signed it "
                    "(or TRACESCORE_BROKER_TLS_INSECURE=true to skip the check, for tests only)"
                ) from None
            if isinstance(cause, ssl.SSLError):
                raise SettingsError(
                    f"TLS with the {what} at {redact(url)} failed ({redact(str(cause))}): "
                    "is the server listening for TLS (rediss://) on that port?"
                ) from None
            # down or unreachable: Celery retries the broker until it is up; the store's clients reconnect
        except redis.TimeoutError as exc:
            # redis-py says "Timeout connecting" alike for a TCP connect and a TLS handshake that
            # got no answer, so a rediss:// timeout is looked at again (silent_to_tls)
            if url.startswith("rediss://") and silent_to_tls(url, timeout_s):
                raise SettingsError(
                    f"TLS with the {what} at {redact(url)} got no answer ({redact(str(exc))}): {TLS_TO_PLAIN}"
                ) from None
            # no answer in time is an outage too, as above: exiting here made a supervisor's crash
            # loop of what a refused connection waits out
        else:
            from worker._guard import BrokerWrites

            writes = BrokerWrites.read(client)  # (None: INFO not allowed here, as on some managed Redis)
            problem = writes.eviction_problem(what, url) if writes is not None else None
            if problem:
                raise SettingsError(problem)
            if what == "broker":
                _check_broker_keys(client, settings.queue)
        finally:
            client.close()


def _check_broker_keys(client: redis.Redis, queue: str) -> None:
    from worker._guard import check_broker_keys  # (with configure_app's: the guard imports the store)
    from worker.store import StoreKeyTypeError

    try:
        check_broker_keys(client, queue)
    except StoreKeyTypeError as exc:
        raise SettingsError(f"the broker's queue: {exc}") from None
    except redis.RedisError:
        pass  # the broker went away meanwhile: Celery waits for it


class ScorersOption(bootsteps.Step):
    """Takes ``--scorers`` from the worker's command line into the app's settings and checks
    them once, up front (settings, credentials, the scorer module), so a wrong value fails the
    start instead of every task."""

    def __init__(self, parent: Any, scorers: str | None = None, **options: Any) -> None:
        global _controller
        app: TracescoreApp = parent.app
        try:
            if scorers:
                app.use_scorers(scorers)
            _check_start(app)
        except Exception as exc:  # Celery would swallow it and stop silently: say why, exit 1
            sys.stderr.write(f"tracescore worker cannot start: {exc}\n")
            raise SystemExit(1) from exc
        _controller = parent
        from worker._loop import start_signal_relay

        start_signal_relay()  # SIGTERM's handler hands its work to it (_begin_grace_period)
        super().__init__(parent, **options)


# celery.bootsteps.RUN (the type stubs do not declare it): a blueprint's state while it runs.
_BLUEPRINT_RUNNING: int = getattr(bootsteps, "RUN", 1)


class ProbeFiles(bootsteps.StartStopStep):
    """The consumer's heartbeat and readiness files for ``tracescore probe`` (``worker._heartbeat``):
    started once the task consumer consumes, beating on the consumer's own event loop."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **options: Any) -> None:
        self._beat: Any = None
        super().__init__(parent, **options)

    def start(self, parent: Any) -> None:
        probe_files.consumer_started()
        if parent.timer is not None:
            self._beat = parent.timer.call_repeatedly(1.0, probe_files.beat, (probe_files.CONSUMER_FILE,))

    def stop(self, parent: Any) -> None:
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None
        # Stopped while the consumer's blueprint still runs: Celery is restarting it after a
        # lost broker connection (a shutdown closes the blueprint first). The process is not
        # wedged, only not ready: its heartbeat goes on from a thread until it consumes again.
        blueprint = getattr(parent, "blueprint", None)
        probe_files.consumer_stopped(reconnecting=getattr(blueprint, "state", None) == _BLUEPRINT_RUNNING)

    def shutdown(self, parent: Any) -> None:
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None
        probe_files.consumer_stopped(reconnecting=False)


def _check_start(app: TracescoreApp) -> None:
    from worker._delivery import check_sinks
    from worker._registry import load_registry

    settings = app.settings
    configure_app(app, settings)
    probe_files.set_probe_dir(settings.probe_dir)
    probe_files.reset()  # an earlier run's files (same emptyDir, same pid) must not speak for this one
    # A wrong password or an unverifiable certificate fails the start; Celery would retry for minutes.
    check_connections(settings)
    if not settings.scorers:
        raise SettingsError("no scorer module: start the worker with --scorers my.module (or TRACESCORE_SCORERS)")
    registry = load_registry(settings.scorers)
    endpoints = check_sinks(settings)
    log.info(
        "worker_starting",
        broker=redact(settings.broker_url),
        store=redact(settings.store_url),
        scorers=",".join(registry),
        queue=settings.queue,
        sinks=",".join(settings.sink_names) or "none",
        endpoints=endpoints,
    )


# The WorkController this process runs (set as it starts; prefork children inherit it).
_controller: Any = None


@signals.worker_shutting_down.connect
def _begin_grace_period(sig: str = "", how: str = "", **_: Any) -> None:
    """SIGTERM/SIGINT in the main process (Celery sends this from its signal handler): stop being
    ready, start the grace period here (threads/solo pools run their tasks here) and in every
    prefork child. A cold shutdown (SIGQUIT) cancels at once, as Celery itself does.

    Being a signal handler, it only unlinks the ready file and marks the shutdown; the timer,
    the children's signals and the log line run on the signal relay's thread (``worker._loop``):
    a log line written here could wait forever for the write lock its own thread holds."""
    from worker._loop import call_from_signal_handler, request_shutdown

    controller = _controller
    if controller is None:
        return
    probe_files.clear(probe_files.READY_FILE)
    request_shutdown()
    call_from_signal_handler(lambda: _drain_node(controller, sig, how))


def _drain_node(controller: Any, sig: str, how: str) -> None:
    from worker._loop import EXIT_ALLOWANCE_S, begin_shutdown
    from worker._task import DRAIN_SIGNAL

    settings = controller.app.settings
    grace = settings.shutdown_grace_seconds if how == "Warm" else 0.0
    if not begin_shutdown(grace, settings.shutdown_cleanup_seconds):
        return
    _exit_by(grace + settings.shutdown_cleanup_seconds + EXIT_ALLOWANCE_S - _EXIT_MARGIN_S)
    pool_info = getattr(getattr(controller, "pool", None), "info", None) or {}
    children = [pid for pid in pool_info.get("processes", []) if pid != os.getpid()]
    for pid in children:
        with contextlib.suppress(ProcessLookupError):  # a child that just exited
            os.kill(pid, DRAIN_SIGNAL)
    log.info("worker_draining", signal=sig, grace_s=grace, children=len(children))


# Before the platform's kill (grace + cleanup + EXIT_ALLOWANCE_S): the backstop's own exit.
_EXIT_MARGIN_S = 1.0
# The exit status of a worker whose shutdown ran past its time (70: a wedged loop, _runtime).
EXIT_SHUTDOWN_OVERRAN = 71


def _exit_by(seconds: float) -> None:
    """The main process ends within ``seconds`` of SIGTERM, whatever its teardown waits on:
    Celery's own (kombu's pidbox, the worker-offline event) calls Redis without a timeout, so a
    Redis that hangs with its connections open held a worker past its kill timer, or forever
    where none comes. Whatever it still held returns as after a SIGKILL (unacked messages come
    back; claims lapse); the grace period's work was done by then."""

    def overran() -> None:
        # os.write, not the log: a thread stuck in a log line may hold its lock.
        with contextlib.suppress(OSError):
            os.write(2, f"tracescore worker: worker_shutdown_overran after {seconds:g}s: exiting\n".encode())
        os._exit(EXIT_SHUTDOWN_OVERRAN)

    timer = threading.Timer(max(0.0, seconds), overran)
    timer.daemon = True
    timer.start()


@signals.worker_init.connect
def _solo_handles_one(sender: Any = None, **_: Any) -> None:
    """A solo pool runs one message at a time whatever ``--concurrency`` says, but Celery keeps
    the number given (or the CPU count) and shows it: its banner said "concurrency: 8 (solo)",
    and the consumer's prefetch count was set from it (the blocking pool reserved one message at
    a time all the same: one unacked at most, measured). Sent once the options are read, before
    the pool and consumer steps take the number, so all of them say 1."""
    from celery.concurrency import get_implementation
    from celery.concurrency.solo import TaskPool as SoloPool

    if sender is not None and get_implementation(sender.pool_cls) is SoloPool:
        sender.concurrency = 1


@signals.worker_ready.connect
def _tune_consumer_gc(**_: Any) -> None:
    """The main process screens every message, and the screen decodes the whole body: tens of
    thousands of objects a message, which under the interpreter's default thresholds set off
    dozens of collections each, rescanning Celery's own heap (18% of the consumer's CPU in
    bench/backfill.py). Its children tune their own when their runtime starts."""
    freeze_startup_objects()


@signals.worker_process_init.connect
def _init_child(**_: Any) -> None:
    from worker._loop import install_drain_handler
    from worker._task import DRAIN_SIGNAL

    app = _controller.app if _controller is not None else None
    if app is not None:
        install_drain_handler(DRAIN_SIGNAL, app.settings.shutdown_grace_seconds, app.settings.shutdown_cleanup_seconds)


@signals.worker_process_shutdown.connect
@signals.worker_shutdown.connect
def _flush_writer(**_: Any) -> None:
    """A process on its way out (a prefork child, then the main process): the drainers' last
    deliveries and closing the runtime's connections, all by the shutdown's one cleanup deadline
    (``worker._loop.cleanup_deadline``; children and the main process share it)."""
    from worker._loop import cleanup_deadline, stop_loop
    from worker._runtime import close_runtime

    cleanup_s: float | None = None
    with contextlib.suppress(Exception):  # settings already checked at start; never fail the exit
        cleanup_s = _controller.app.settings.shutdown_cleanup_seconds if _controller is not None else None
    close_runtime(cleanup_deadline(cleanup_s))
    stop_loop()
    if _controller is not None:
        from worker._guard import hand_back_held

        hand_back_held(_controller.app)


app = create_app(None)
score_batch_task = app.score_batch_task
