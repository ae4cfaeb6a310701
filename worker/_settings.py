"""The worker's settings: one pydantic-settings object read from ``TRACESCORE_*`` variables.

A bad value fails at start-up with the variable's name and what it expects, never later.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from functools import lru_cache
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings import SettingsError as PydanticSettingsError

from tracing import BrokerTLS, redact
from tracing.queue import DEFAULT_MAX_PAYLOAD_BYTES, query_password_problem
from worker._errors import SettingsError

__all__ = [
    "MAX_TRIES",
    "NO_BROKER",
    "SCREENED_BROKER_SCHEMES",
    "SINK_NAMES",
    "TLS_TO_PLAIN",
    "ModelRateLimit",
    "Settings",
    "SettingsError",
    "broker_url_problem",
    "get_settings",
    "load_settings",
    "missing_database",
    "shown_url",
    "silent_to_tls",
]

# What a rediss:// URL that no TLS answers (a Redis serving plain text: the handshake waits out its
# timeout) is told, by the worker's start and by every command that talks to Redis.
TLS_TO_PLAIN = "rediss:// asks for TLS: if that Redis serves plain text, use redis://"


def silent_to_tls(url: str, timeout_s: float) -> bool:
    """Whether a ``rediss://`` endpoint takes a TCP connection but answers nothing to a TLS
    ClientHello in ``timeout_s``: what a plain Redis does (it waits for a command line that never
    ends), so the URL most likely has one letter too many. Any listener that accepts and stays
    silent looks the same from here, and the hint is still the most useful thing to say about a
    port that is open yet not speaking TLS. Not silent: the name does not resolve, the TCP
    connect fails or times out (a black-holed route, a firewall, a TLS endpoint not up yet) or
    the server answers the handshake (it speaks TLS; what timed out came after): an outage,
    waited for like a ``redis://`` one. The whole probe, lookup to handshake, takes ``timeout_s``
    at most, however many addresses the name has; the lookup half of it at most (one slower is
    not silent)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "localhost", parts.port or 6379
    # One deadline for the whole probe (socket.create_connection gave the lookup no bound and
    # each address the whole timeout): the lookup, then each address a share of what is left,
    # one share kept for the handshake, so a silent first address leaves time for the rest. The
    # lookup gets half of it at most: a handshake left what a slow lookup did not take was cut
    # short and called silent (0.1 s of a 1 s probe after a 0.8 s lookup, for a TLS port that
    # answers in 0.3 s): a slower lookup reached nothing in time, which is no sign of silence.
    deadline = time.monotonic() + timeout_s
    addresses = _resolve(host, port, timeout_s / 2)
    sock: socket.socket | None = None
    for i, (family, kind, proto, _, address) in enumerate(addresses):
        share = (deadline - time.monotonic()) / (len(addresses) - i + 1)
        if share <= 0:
            return False
        sock = socket.socket(family, kind, proto)
        sock.settimeout(share)
        try:
            sock.connect(address)
            break
        except OSError:  # (TimeoutError included)
            sock.close()
            sock = None
    if sock is None:  # unresolved in time, or no address took the connection
        return False
    # Only whether TLS answers at all: the certificate is verified by the check's own client.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        with context.wrap_socket(sock, server_hostname=host):
            return False
    except TimeoutError:
        return True
    except OSError:  # an alert or a reset is an answer (ssl.SSLError is an OSError)
        return False
    finally:
        sock.close()


def _resolve(host: str, port: int, timeout_s: float) -> list[tuple[Any, Any, int, str, Any]]:
    """``host``'s TCP addresses, or none if the lookup fails or takes over ``timeout_s``. The
    system's resolver cannot be interrupted: it is left to finish on a daemon thread."""
    found: list[list[tuple[Any, Any, int, str, Any]]] = []
    done = threading.Event()

    def lookup() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except (OSError, UnicodeError):  # (socket.gaierror is an OSError)
            pass
        finally:
            done.set()

    threading.Thread(target=lookup, name="tracescore-tls-probe-lookup", daemon=True).start()
    done.wait(timeout_s)
    return found[0] if found else []


def missing_database(what: str, url: str, where: str) -> str:
    """What to say when Redis answers SELECT with "DB index is out of range": the URL names a
    database that Redis does not have, which no retry fixes."""
    database = urlsplit(url).path.strip("/") or "0"
    return (
        f"the {what} at {redact(url)} has no database {database[:20]}: a Redis has 16 (0 to 15) unless its"
        f" `databases` setting says more; fix the /{database[:20]} in {where}"
    )


# What an empty broker URL means, for the commands that need one to say so.
NO_BROKER = "TRACESCORE_BROKER_URL is empty (embedded mode, which only backfill and score have)"
# The broker URLs kombu serves with its Redis transport, the one worker._guard screens.
SCREENED_BROKER_SCHEMES = ("redis", "rediss", "redis+socket")
# The shortest TRACESCORE_SCORE_TTL_SECONDS (see ``Settings.score_ttl_seconds``).
MIN_SCORE_TTL_SECONDS = 24 * 3600
# The tries of a message the workers' screen takes (worker._guard: its retries less its waits
# for the store); past it a retries header is taken for forged. The settings keep within it.
MAX_TRIES = 1000


def redis_py_url(url: str) -> str:
    """``url`` as redis-py reads it: kombu's ``redis+socket://`` (a Unix socket, its database in
    ``virtual_host``) is redis-py's ``unix://`` (``db``), which kombu does not read; any other
    URL is unchanged."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "redis+socket":
        return url
    where, _, query = rest.partition("?")
    pairs = [("db" if k == "virtual_host" else k, v) for k, v in parse_qsl(query, keep_blank_values=True)]
    return f"unix://{where}" + (f"?{urlencode(pairs)}" if pairs else "")


def shown_url(url: str) -> str:
    """``url`` to print, its password masked even when the URL does not parse: a slash or colon
    mistyped after the scheme (``redis:/:PASSWORD@host``) left no ``://`` for ``redact`` to find,
    and the error naming the URL printed the password whole."""
    text = redact(url)
    head, at, where = text.rpartition("@")
    if not at:
        return text
    lead = _SCHEME_LEAD.match(head)
    start = lead.end() if lead else 0
    user, colon, _ = head[start:].partition(":")
    return f"{head[:start]}{user + colon if colon else ''}***@{where}"


# A scheme and whatever colons and slashes follow it, however mistyped ("redis:/", "redis//").
_SCHEME_LEAD = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*:?/*")


def _url_problem(url: str) -> str | None:
    """What is wrong with a redis:// or rediss:// URL's host, port, database or query, else None."""
    if url.partition("://")[0].lower() not in ("redis", "rediss"):
        return None
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (a property that raises on a bad port)
    except ValueError:
        return "has a port that is not a number from 0 to 65535 (or a host that is not one)"
    database = parts.path.strip("/")
    if database and not database.isdecimal():
        return f"names database {database[:20]!r} in its path: a Redis database is a number, e.g. redis://host:6379/0"
    if parts.query:
        # Loaded only for a URL with a query: most have none, and `probe live` reads settings.
        from redis.connection import parse_url

        try:
            parse_url(url)  # type: ignore[no-untyped-call]
        except ValueError as exc:  # its words name the parameter ("Invalid value for 'db' ...")
            return f"has a query the Redis client cannot read: {exc}"
    return None


_SPACED = "starts or ends with a space (pasted with it?): give the URL without it"


def broker_url_problem(url: str) -> str | None:
    """What is wrong with a broker URL, said after its name (``TRACESCORE_BROKER_URL (url) ...``),
    else None; an empty URL is embedded mode, not a problem."""
    if not url:
        return None
    if url != url.strip():  # (else "is not a Redis URL", or "names database '0 '", the space unseen)
        return _SPACED
    if url.partition("://")[0].lower() not in SCREENED_BROKER_SCHEMES:
        # The message screen (worker._guard) lives in kombu's Redis transport: another
        # transport would hand hostile messages to Celery unscreened.
        schemes = ", ".join(s + "://" for s in SCREENED_BROKER_SCHEMES)
        return f"is not a Redis URL: tracescore's queue runs on Redis ({schemes})"
    return query_password_problem(url) or _url_problem(url) or _kombu_query_problem(url)


def _kombu_query_problem(url: str) -> str | None:
    """A redis:// or rediss:// broker URL's query parameter kombu's Connection cannot take, else
    None: it passes each one (but ``ssl_*``) to Connection as a keyword, and the worker's start
    and status's ping ended in "TypeError: Connection._init_params() got an unexpected keyword
    argument" (socket_timeout, db: redis-py reads both)."""
    if url.partition("://")[0].lower() not in ("redis", "rediss"):
        return None
    for key, _ in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        if not key.startswith("ssl_"):
            return (
                f"has a query parameter the broker's client (kombu) cannot take: {key[:40]!r}; a broker URL's"
                " query holds ssl_* options only (its database goes in the path: redis://host:6379/0)"
            )
    return None


def store_url_problem(url: str) -> str | None:
    """What is wrong with a score store URL (``TRACESCORE_REDIS_URL``), else None: redis-py's
    schemes (and kombu's ``redis+socket://``, read as its ``unix://``)."""
    if url and url != url.strip():
        return _SPACED
    if url and url.partition("://")[0].lower() not in (*SCREENED_BROKER_SCHEMES, "unix"):
        return "is not a Redis URL: the score store is a Redis (redis://, rediss://, unix://)"
    return _url_problem(url)


class ModelRateLimit(BaseModel):
    """Budget of one judge model, shared by every worker: requests and tokens per minute."""

    # A misspelt key ("requests_per_minut") left the model without any limit, silently.
    model_config = ConfigDict(extra="forbid")

    requests_per_minute: float | None = Field(default=None, gt=0)
    tokens_per_minute: float | None = Field(default=None, gt=0)


# The dead-letter list's bounds (``dlq_max_letters``, ``dlq_max_bytes``), its oldest letters
# dropped past either: a letter keeps its message, up to 1 MiB, and a producer whose every
# message is refused makes one of each. The count alone let 100,000 letters of 1 MiB fill any
# Redis (a 1 MiB letter takes 1.25 MiB of it, measured). 256 MiB of letters is about 320 MiB of
# Redis: a fifth of the 1536 MiB the shipped Redis has (deploy/k8s/redis.yaml), the rest left to
# the queue, the score records and the sinks' backlog; 256 letters of the largest kind, or all
# 100,000 of ~2.6 kB.
DEFAULT_DLQ_MAX_LETTERS = 100_000
DEFAULT_DLQ_MAX_BYTES = 256 * 1024 * 1024
# Each sink's bound on its dead letters (``sink_max_dead_letters``), its oldest dropped past it:
# a sink that refuses every score (a deleted project, a revoked key) makes a letter of each, and
# the letters outlive the scores' records (no TTL).
DEFAULT_SINK_MAX_DEAD_LETTERS = 100_000


# The fields that hold a URL, which may carry a password (``redis://:PASSWORD@``, ``https://user:PASSWORD@``).
_URL_FIELDS = frozenset({"broker_url", "redis_url", "phoenix_url", "mlflow_url", "langfuse_host"})


class Settings(BaseSettings):
    """Every knob of the worker. Environment: ``TRACESCORE_<FIELD>`` (case-insensitive)."""

    model_config = SettingsConfigDict(env_prefix="TRACESCORE_", extra="ignore", frozen=True)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # Settings printed whole (an assertion, a traceback's locals, a debugger) showed each
        # URL's password: shown as the error messages show them.
        for name, value in super().__repr_args__():
            yield name, shown_url(value) if name in _URL_FIELDS and isinstance(value, str) else value

    broker_url: str = "redis://127.0.0.1:6379/0"
    # The score store (claims, checkpoints, records, DLQ, limiter); defaults to broker_url.
    redis_url: str | None = None
    scorers: str | None = None
    queue: str = "tracescore"

    # Concurrency inside one worker process: judge calls in flight per judge model, and scorer
    # runs in flight overall (function-only scorers are bounded by this alone).
    model_concurrency: int = Field(default=64, ge=1)
    run_concurrency: int = Field(default=256, ge=1)
    # {"openai/gpt-4o-mini": {"requests_per_minute": 500, "tokens_per_minute": 200000}}
    rate_limits: dict[str, ModelRateLimit] = Field(default_factory=dict)
    default_requests_per_minute: float | None = Field(default=None, gt=0)
    default_tokens_per_minute: float | None = Field(default=None, gt=0)

    # How long a score's record is kept: it is what keeps its run from being scored (and paid
    # for) again when its message comes back, and a job from counting it twice. At least a day
    # (``_check``): a `dlq retry` once a daily budget resets (00:00 UTC) resends whole messages.
    score_ttl_seconds: int = Field(default=7 * 24 * 3600)
    # How long a worker's claim on a score lasts; 0 → the task's hard time limit (a claim is
    # never needed longer than the task that holds it, and must lapse before a redelivery).
    claim_ttl_seconds: int = Field(default=0, ge=0)
    checkpoint_ttl_seconds: int = Field(default=24 * 3600, ge=60)

    task_soft_time_limit: float = Field(default=240.0, gt=0)
    task_time_limit: float = Field(default=300.0, gt=0)
    visibility_timeout: float = Field(default=360.0, gt=0)
    # kombu's sweep that redelivers a dead worker's unacked messages runs every
    # interval × throttle seconds (kombu's default 10 × 10); 1 keeps it at the interval.
    unacked_restore_interval: int = Field(default=10, ge=1)
    unacked_restore_throttle: int = Field(default=1, ge=1)
    max_payload_bytes: int = Field(default=DEFAULT_MAX_PAYLOAD_BYTES, ge=1024)
    retry_budget: int = Field(default=3, ge=0)
    retry_backoff_seconds: float = Field(default=2.0, ge=0)
    dlq_max_letters: int = Field(default=DEFAULT_DLQ_MAX_LETTERS, ge=1)
    dlq_max_bytes: int = Field(default=DEFAULT_DLQ_MAX_BYTES, ge=1)

    # --- score sinks (helper A) ---
    # Where scores go, each delivered at least once from the outbox: a comma list of
    # otlp, jsonl, console, phoenix, mlflow, langfuse; "none" stores them only. Unset: WRITER.
    sinks: str | None = None
    # The older single-sink setting, read when SINKS is unset (WRITER_PATH: JSONL_PATH's older name).
    writer: Literal["otlp", "jsonl", "console", "none"] = "otlp"
    writer_path: str | None = None
    jsonl_path: str | None = None
    phoenix_url: str | None = None
    phoenix_api_key: SecretStr | None = None
    mlflow_url: str | None = None
    mlflow_token: SecretStr | None = None
    langfuse_host: str | None = None
    langfuse_public_key: str | None = None
    langfuse_secret_key: SecretStr | None = None
    # Attempts per score and sink before it becomes the sink's dead letter (a refusal: at once),
    # the retry backoff (first delay doubling to the cap; a sink's Retry-After is honoured), and
    # how long a drainer's lease on a score lasts before another drainer may take it.
    sink_max_attempts: int = Field(default=12, ge=1)
    sink_backoff_seconds: float = Field(default=1.0, gt=0)
    sink_backoff_max_seconds: float = Field(default=300.0, gt=0)
    sink_lease_seconds: float = Field(default=60.0, gt=0)
    sink_batch_size: int = Field(default=100, ge=1)
    # Dead letters kept per sink: past it the oldest go as a new one comes, counted per sink
    # (dead_letters_dropped).
    sink_max_dead_letters: int = Field(default=DEFAULT_SINK_MAX_DEAD_LETTERS, ge=1)
    # Scoring in place (backfill without a broker): how long the command waits at the end for
    # its sinks to take what is still queued.
    sink_drain_timeout_seconds: float = Field(default=30.0, ge=0)
    # --- end score sinks ---

    # rediss:// (broker and store): the PEM CA bundle that signed the server's certificate
    # (default: the system's CAs). Verification is on unless BROKER_TLS_INSECURE asks otherwise.
    broker_ca_file: str | None = None
    broker_tls_insecure: bool = False

    # A scorer run longer than this is stopped and recorded as error_type "timeout" (a step
    # blocking the event loop is interrupted, or its process replaced); 0 → ¾ of the soft limit.
    run_timeout_seconds: float = Field(default=0.0, ge=0)
    # Resident memory (RSS) per worker process, in MB: past it, the run the loop is in becomes
    # error_type "memory" and the process is replaced (scoring in place, without a broker, it is
    # the address-space cap and the process goes on). 0 → no limit (the OOM killer decides).
    memory_limit_mb: int = Field(default=0, ge=0)

    # A task message whose ETA lies further ahead than this is refused (a far-future ETA would
    # sit in a worker's memory); the task's own retries are delayed by at most this much.
    # A worker holds an ETA message unacked until it runs: the wait plus the task's hard limit
    # must stay under the visibility timeout, or Redis hands it to a second worker meanwhile.
    # Unset: 30 s, lowered to fit when the timeouts are tight.
    max_eta_seconds: float = Field(default=30.0, gt=0)

    # --- metrics (helper D, worker/metrics/) ---
    # The node's Prometheus endpoint (/metrics on this port, served by the worker's parent
    # process for all of its pool's children); 0 → no endpoint.
    metrics_port: int = Field(default=0, ge=0, le=65535)
    metrics_host: str = "0.0.0.0"
    # Where the pool's processes keep their metric files (<dir>/<node name>, emptied at start);
    # unset → the temp dir. Give each container a writable, ideally tmpfs, path.
    metrics_dir: str | None = None
    # The same metrics through OTLP/HTTP when OTEL_EXPORTER_OTLP_METRICS_ENDPOINT or
    # OTEL_EXPORTER_OTLP_ENDPOINT is set (every OTEL_METRIC_EXPORT_INTERVAL ms); false keeps
    # them off while the endpoint is there for the scores.
    otlp_metrics: bool = True

    # --- shutdown and probes (helper F) ---
    # After SIGTERM, how long runs in flight may go on; then they are cancelled, their claims
    # released and their messages requeued. 25 s fits Kubernetes' default 30 s grace period.
    shutdown_grace_seconds: float = Field(default=25.0, ge=0)
    # After the grace period, one deadline for the whole way out of each process: cancelled runs'
    # cleanup, the drainers' last deliveries, closing the store's connections, all sharing it.
    # What is not delivered by then stays in the outbox (its lease hands it to another worker).
    # Give the platform grace + this + a few seconds (worker._loop.EXIT_ALLOWANCE_S) before SIGKILL.
    shutdown_cleanup_seconds: float = Field(default=10.0, ge=1, le=120)
    # Where the worker writes the heartbeat and readiness files `tracescore probe` reads
    # (one directory per worker: a pod's /tmp). Unset: no files, and `probe` says so.
    probe_dir: str | None = None
    # --- end shutdown and probes ---

    # --- judge cost (helper E) ---
    # JSON: USD per UTC day {"scorers": {"<scorer id>": 5}, "models": {"<model id>": 20},
    # "total": 50}, shared by every worker through Redis (worker/_budget.py).
    budgets: str = ""
    # JSON: model id → {"input", "output", "cached_input", "cache_write"} USD per million
    # tokens, over the defaults in scorers/judge/_prices.py.
    prices: str = ""
    # Failed judge calls one run may make across every delivery (0: one delivery's attempts +
    # one per retry of TRACESCORE_RETRY_BUDGET; worker/_budget.py default_attempt_cap).
    max_judge_attempts_per_run: int = Field(default=0, ge=0)

    @field_validator("budgets", "prices")
    @classmethod
    def _check_cost_json(cls, value: str, info: Any) -> str:
        if not value.strip():  # unset: nothing to check, and no need to load the budget guard
            return value
        from worker._budget import parse_budgets, parse_prices

        (parse_budgets if info.field_name == "budgets" else parse_prices)(value)
        return value

    # --- end judge cost ---

    @field_validator("rate_limits", mode="before")
    @classmethod
    def _parse_rate_limits(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = json.loads(value) if value.strip() else {}
        return value

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.task_soft_time_limit >= self.task_time_limit:
            raise ValueError(
                f"TRACESCORE_TASK_SOFT_TIME_LIMIT ({self.task_soft_time_limit}) must be below "
                f"TRACESCORE_TASK_TIME_LIMIT ({self.task_time_limit})"
            )
        if self.visibility_timeout <= self.task_time_limit:
            # A task still running when Redis redelivers it would run twice at once.
            raise ValueError(
                f"TRACESCORE_VISIBILITY_TIMEOUT ({self.visibility_timeout}) must exceed "
                f"TRACESCORE_TASK_TIME_LIMIT ({self.task_time_limit})"
            )
        if self.score_ttl_seconds < MIN_SCORE_TTL_SECONDS:
            raise ValueError(
                f"TRACESCORE_SCORE_TTL_SECONDS ({self.score_ttl_seconds}) must be at least "
                f"{MIN_SCORE_TTL_SECONDS} (a day): a run whose record has expired is scored and paid for "
                "again when its message comes back (a redelivery, a `dlq retry` after a daily budget "
                "resets), counted twice by its backfill job, and missing when the job reads its scores back"
            )
        if self.claim_ttl >= self.visibility_timeout:
            raise ValueError(
                f"TRACESCORE_CLAIM_TTL_SECONDS ({self.claim_ttl}) must be below "
                f"TRACESCORE_VISIBILITY_TIMEOUT ({self.visibility_timeout}), or a redelivered message "
                "would find its scores still claimed by the dead worker"
            )
        for variable, url, problem in (
            ("TRACESCORE_BROKER_URL", self.broker_url, broker_url_problem(self.broker_url)),
            ("TRACESCORE_REDIS_URL", self.redis_url or "", store_url_problem(self.redis_url or "")),
        ):
            if problem:  # else kombu or redis-py fails later with a ValueError naming no variable
                raise ValueError(f"{variable} ({shown_url(url)}) {problem}")
        if self.broker_ca_file and not os.path.isfile(self.broker_ca_file):
            raise ValueError(
                f"TRACESCORE_BROKER_CA_FILE ({self.broker_ca_file}) is not a readable file: "
                "give the PEM file of the CA that signed the Redis server's certificate"
            )
        if self.broker_ca_file and self.broker_tls_insecure:
            raise ValueError(
                "TRACESCORE_BROKER_CA_FILE and TRACESCORE_BROKER_TLS_INSECURE are both set: "
                "verify against the CA file, or turn verification off, not both"
            )
        _check_sinks(self)
        return self

    @property
    def sink_names(self) -> tuple[str, ...]:
        """The configured sinks, in order, without repeats (SINKS, else WRITER; none → ())."""
        if self.sinks is not None:
            names = [n.strip().lower() for n in self.sinks.split(",") if n.strip()]
        else:
            names = [self.writer]
        return tuple(dict.fromkeys(n for n in names if n != "none"))

    @property
    def jsonl_file(self) -> str | None:
        """The JSONL sink's file (JSONL_PATH, else the older WRITER_PATH)."""
        return self.jsonl_path or self.writer_path

    @property
    def tls(self) -> BrokerTLS:
        return BrokerTLS(ca_file=self.broker_ca_file, insecure=self.broker_tls_insecure)

    @property
    def store_url(self) -> str:
        """The score store's URL, with the TLS settings as query parameters for redis-py
        (the store and the limiter take only a URL); a plain ``redis://`` URL is unchanged."""
        return self.tls.url(redis_py_url(self.redis_url or self.broker_url))

    @property
    def broker_redis_url(self) -> str:
        """The broker's URL as redis-py reads it (kombu's ``redis+socket://`` is its ``unix://``),
        for the commands that talk to the broker's Redis themselves."""
        return redis_py_url(self.broker_url)

    @property
    def claim_ttl(self) -> int:
        return self.claim_ttl_seconds or math.ceil(self.task_time_limit)

    @property
    def claim_tries(self) -> int:
        """The tries of a message waiting for a score another delivery holds, each at most
        ``max_eta_seconds`` apart: enough to outlast that delivery's claim."""
        return math.ceil(self.claim_ttl / self.max_eta_seconds) + 1

    def retry_delay(self, retries: int) -> float:
        """The wait before a message's (or an embedded batch's) next try after ``retries``:
        ``retry_backoff_seconds`` doubled per retry, at most ``max_eta_seconds`` (the workers'
        screen refuses an ETA further ahead). The doubling stops at 64, past any such cap: 2**n
        of a long wait for the store, or of a large retry budget, overflowed a float (n > 1023)."""
        return min(self.retry_backoff_seconds * 2.0 ** min(retries, 64), self.max_eta_seconds)

    def rate_limit(self, model_id: str) -> ModelRateLimit:
        return self.rate_limits.get(model_id) or ModelRateLimit(
            requests_per_minute=self.default_requests_per_minute,
            tokens_per_minute=self.default_tokens_per_minute,
        )

    @property
    def run_timeout(self) -> float:
        return self.run_timeout_seconds or self.task_soft_time_limit * 0.75

    @model_validator(mode="after")
    def _check_run_limits(self) -> Settings:
        if self.run_timeout >= self.task_soft_time_limit:
            # The run's own timeout must fire first, or the whole batch is cut off and retried.
            raise ValueError(
                f"TRACESCORE_RUN_TIMEOUT_SECONDS ({self.run_timeout}) must be below "
                f"TRACESCORE_TASK_SOFT_TIME_LIMIT ({self.task_soft_time_limit})"
            )
        room = self.visibility_timeout - self.task_time_limit
        if self.max_eta_seconds >= room:
            if "max_eta_seconds" in self.model_fields_set:
                raise ValueError(
                    f"TRACESCORE_MAX_ETA_SECONDS ({self.max_eta_seconds:g}) plus TRACESCORE_TASK_TIME_LIMIT "
                    f"({self.task_time_limit:g}) must stay below TRACESCORE_VISIBILITY_TIMEOUT "
                    f"({self.visibility_timeout:g}), or Redis redelivers a waiting retry to a second worker: "
                    f"use a TRACESCORE_MAX_ETA_SECONDS below {room:g}"
                )
            # The default, fitted to tight timeouts (the model is frozen; this is its construction).
            object.__setattr__(self, "max_eta_seconds", room / 2)
        # A message's tries are its retries less its waits for the store; the workers' screen
        # refuses one past MAX_TRIES (a forged count), which a budget over it, or the tries spent
        # waiting for a score another delivery holds (one a max_eta_seconds, until its claim lapses),
        # would reach: every such message would end as a bad_headers letter.
        if self.retry_budget > MAX_TRIES:
            raise ValueError(f"TRACESCORE_RETRY_BUDGET ({self.retry_budget}) may be at most {MAX_TRIES}")
        claim_tries = self.claim_tries
        if claim_tries > MAX_TRIES:
            raise ValueError(
                f"{'TRACESCORE_CLAIM_TTL_SECONDS' if self.claim_ttl_seconds else 'TRACESCORE_TASK_TIME_LIMIT'}"
                f" ({self.claim_ttl}) over TRACESCORE_MAX_ETA_SECONDS"
                f" ({self.max_eta_seconds:g}) is {claim_tries} tries of a message waiting for a score another"
                f" delivery holds, past the {MAX_TRIES} the workers take: raise TRACESCORE_MAX_ETA_SECONDS"
            )
        if 0 < self.memory_limit_mb < 256:
            raise ValueError(
                f"TRACESCORE_MEMORY_LIMIT_MB ({self.memory_limit_mb}) is too small for a worker process "
                "(its threads alone reserve more address space); use 0 (no cap) or 256 and above"
            )
        return self


SINK_NAMES = ("otlp", "jsonl", "console", "phoenix", "mlflow", "langfuse")

# What each sink needs set: (field, variable).
_SINK_NEEDS: dict[str, tuple[tuple[str, str], ...]] = {
    "jsonl": (("jsonl_file", "TRACESCORE_JSONL_PATH (or its older name TRACESCORE_WRITER_PATH)"),),
    "phoenix": (("phoenix_url", "TRACESCORE_PHOENIX_URL or --phoenix-url"),),
    "mlflow": (("mlflow_url", "TRACESCORE_MLFLOW_URL or --mlflow-url"),),
    "langfuse": (
        ("langfuse_host", "TRACESCORE_LANGFUSE_HOST or --langfuse-host"),
        ("langfuse_public_key", "TRACESCORE_LANGFUSE_PUBLIC_KEY"),
        ("langfuse_secret_key", "TRACESCORE_LANGFUSE_SECRET_KEY"),
    ),
}


def _check_sinks(settings: Settings) -> None:
    where = "TRACESCORE_SINKS" if settings.sinks is not None else "TRACESCORE_WRITER"
    unknown = [n for n in settings.sink_names if n not in SINK_NAMES]
    if unknown:  # (--sink takes only known names)
        known = ", ".join(SINK_NAMES)
        raise ValueError(f"{where} names unknown sink(s) {', '.join(unknown)}: use a comma list of {known} (or none)")
    named = "--sink or TRACESCORE_SINKS" if settings.sinks is not None else "TRACESCORE_WRITER"
    for name in settings.sink_names:
        for attr, variable in _SINK_NEEDS.get(name, ()):
            if not getattr(settings, attr):
                raise ValueError(f"the {name} sink ({named}) needs {variable}")


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment (and ``overrides``); a bad value raises ``SettingsError``."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            message = str(error["msg"]).removeprefix("Value error, ")
            if error["loc"]:
                variable, *inside = (str(part) for part in error["loc"])
                where = f" at {'.'.join(inside)}" if inside else ""  # which key of a JSON value
                problems.append(f"TRACESCORE_{variable.upper()}{where}: {message}")
            else:
                problems.append(message)
        raise SettingsError("bad worker settings: " + "; ".join(problems)) from None
    except (json.JSONDecodeError, PydanticSettingsError) as exc:
        # pydantic-settings parses dict-valued variables as JSON before validation.
        raise SettingsError(
            f"TRACESCORE_RATE_LIMITS must be a JSON object like "
            f'{{"openai/gpt-4o-mini": {{"requests_per_minute": 500}}}}: {exc}'
        ) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once."""
    return load_settings()
