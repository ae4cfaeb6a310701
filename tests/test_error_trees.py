"""One error tree per package: every public error class has a ``category``, decided in one place,
no vendor error escapes untranslated, and the judge's retries and the worker's redelivery agree
on every status."""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import random
import socket
from collections.abc import Callable, Iterable
from types import ModuleType, SimpleNamespace
from typing import Any, get_args

import anthropic
import httpx2
import openai
import pytest

import scorers
import scorers.judge
import tracing
import tracing._errors
import tracing.otlp
import tracing.queue
import tracing.sources
from scorers import ScoreResult, ScorerRunError
from scorers._errors import category_for_status
from scorers.judge import (
    ErrorCategory,
    ErrorContext,
    JudgeCallInfo,
    JudgeProviderError,
    JudgeStatusError,
    StreamErrorRetryProcessor,
    translate_sdk_errors,
)

CATEGORIES = set(get_args(ErrorCategory))
REQUEST = httpx2.Request("POST", "http://judge.invalid/v1/chat/completions")
PARTIAL = ScoreResult(run_id="t:s")


def _failed(cause: BaseException) -> ScorerRunError:
    """A run whose step raised ``cause``, as ``Scorer.run`` reports it."""
    return ScorerRunError("m", scorer_id="s", failed_step="analyze", completed_steps=(), partial=PARTIAL, cause=cause)


def _error_classes(modules: Iterable[ModuleType]) -> set[type[BaseException]]:
    found: set[type[BaseException]] = set()
    for module in modules:
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name, None)
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                found.add(obj)
    return found


def _worker_modules() -> list[ModuleType]:
    import worker
    import worker._errors
    import worker._guard
    import worker._reconnect

    # (the two errors that are also Redis errors live beside the code that raises them)
    modules = [worker, worker._errors, worker._guard, worker._reconnect]
    try:
        import worker.store

        modules.append(worker.store)
    except ImportError:  # the store package is optional in this layout
        pass
    return modules


def _request() -> Any:
    """What RunTooLarge reads of a request: its ids (the spans are never in the message)."""
    return SimpleNamespace(trace_id="1" * 32, target_span_ids=["2" * 16])


def _provider(cls: type[JudgeProviderError], status: int | None = None) -> JudgeProviderError:
    return cls("m", provider="openai", model_id="openai/m", status_code=status)


def _instances() -> dict[type[BaseException], tuple[BaseException, ErrorCategory]]:
    """One instance of every public error class, and the category it must have."""
    from scorers.judge import (
        JudgeAuthError,
        JudgeBadRequestError,
        JudgeCallRefused,
        JudgeConnectionError,
        JudgeContextLengthError,
        JudgeError,
        JudgeOutputError,
        JudgeProcessorError,
        JudgeRateLimitError,
        JudgeResponseError,
        JudgeServerError,
        JudgeTimeoutError,
    )
    from tracing._errors import (
        MessageShapeError,
        OtlpDecodeError,
        QueueKeyError,
        RunTooLarge,
        SourceError,
        TraceReadError,
        TracingError,
    )
    from worker._errors import (
        LoopBlockedError,
        RegistryError,
        RunLimitError,
        ScorerClosedError,
        SettingsError,
        StepExitError,
        StoreKeyTypeError,
        UnknownScorerError,
        UnreadableCounterError,
        UnreadableStateError,
        WorkerError,
    )
    from worker._guard import BrokerUnwritableError
    from worker._reconnect import StoreUnavailableError

    return {
        scorers.ScorerError: (scorers.ScorerError("m"), "internal"),
        scorers.ScorerConfigError: (scorers.ScorerConfigError("m"), "config"),
        scorers.RunInputError: (scorers.RunInputError("m"), "invalid_input"),
        ScorerRunError: (_failed(_provider(JudgeServerError, 503)), "retryable"),
        JudgeError: (JudgeError("m"), "internal"),
        JudgeProviderError: (_provider(JudgeProviderError), "unknown"),
        JudgeConnectionError: (_provider(JudgeConnectionError), "retryable"),
        JudgeTimeoutError: (_provider(JudgeTimeoutError), "retryable"),
        JudgeStatusError: (_provider(JudgeStatusError, 409), "retryable"),
        JudgeAuthError: (_provider(JudgeAuthError), "auth"),
        JudgeBadRequestError: (_provider(JudgeBadRequestError), "invalid_request"),
        JudgeContextLengthError: (_provider(JudgeContextLengthError, 400), "invalid_request"),
        JudgeRateLimitError: (_provider(JudgeRateLimitError), "retryable"),
        JudgeServerError: (_provider(JudgeServerError), "retryable"),
        JudgeResponseError: (_provider(JudgeResponseError), "unknown"),
        JudgeOutputError: (JudgeOutputError("m", model_id="m", step="analyze", raw_output=None), "invalid_output"),
        JudgeProcessorError: (JudgeProcessorError("m"), "internal"),
        JudgeCallRefused: (JudgeCallRefused("m", error_type="budget_exhausted"), "retryable"),
        TracingError: (TracingError("m"), "internal"),
        TraceReadError: (TraceReadError("no_target", "m"), "invalid_input"),
        MessageShapeError: (MessageShapeError("bad_message", "m"), "invalid_input"),
        OtlpDecodeError: (OtlpDecodeError("m", where="f:1"), "invalid_input"),
        SourceError: (SourceError("m"), "config"),
        RunTooLarge: (RunTooLarge(_request(), 3_000_000, 2_000_000), "invalid_input"),
        QueueKeyError: (QueueKeyError("tracescore", "string", "list"), "config"),
        WorkerError: (WorkerError("m"), "internal"),
        SettingsError: (SettingsError("m"), "config"),
        RegistryError: (RegistryError("m"), "config"),
        UnknownScorerError: (UnknownScorerError("x", ["a"]), "config"),
        StoreUnavailableError: (StoreUnavailableError("m"), "retryable"),
        BrokerUnwritableError: (BrokerUnwritableError("full", "LPUSH"), "retryable"),
        StoreKeyTypeError: (StoreKeyTypeError("k", "list", "hash"), "config"),
        UnreadableStateError: (UnreadableStateError("k", "1 problem(s), first at status"), "config"),
        UnreadableCounterError: (UnreadableCounterError("k", "scored", ("unreadable:scored",), "", 1), "config"),
        RunLimitError: (RunLimitError("m", error_type="timeout"), "timeout"),
        ScorerClosedError: (ScorerClosedError(), "internal"),
        StepExitError: (StepExitError("s", 2), "internal"),
        LoopBlockedError: (LoopBlockedError(), "retryable"),
    }


# A signal, not an error: ``not_scorable`` raises it and the runner catches it in one place.
NOT_ERRORS: set[type[BaseException]] = {scorers.NotScorable}


@pytest.mark.parametrize(
    "modules",
    [
        pytest.param(lambda: [scorers, scorers.judge, scorers._errors, scorers.judge._errors], id="scorers"),
        pytest.param(lambda: [tracing, tracing._errors, tracing.otlp, tracing.queue, tracing.sources], id="tracing"),
        pytest.param(_worker_modules, id="worker"),
    ],
)
def test_every_public_error_class_has_a_category(modules: Callable[[], list[ModuleType]]) -> None:
    """Each public error class of the package has a category from the one list."""
    public = _error_classes(modules()) - NOT_ERRORS
    instances = _instances()
    missing = sorted(cls.__qualname__ for cls in public if cls not in instances)
    assert not missing, f"public error classes without a category here: {missing}"
    for cls in public:
        instance, expected = instances[cls]
        assert type(instance) is cls
        assert instance.category in CATEGORIES, cls  # type: ignore[attr-defined]
        assert instance.category == expected, cls  # type: ignore[attr-defined]


def test_package_trees_have_one_root_each() -> None:
    """Every error a package raises on purpose derives from the package's one base class."""
    from tracing._errors import TracingError
    from worker._errors import WorkerError

    for cls, _ in _instances().items():
        module = cls.__module__.split(".")[0]
        base = {"scorers": scorers.ScorerError, "tracing": TracingError, "worker": WorkerError}[module]
        assert issubclass(cls, base), cls


# --- no vendor error escapes -----------------------------------------------------------------

# Usage errors of the HTTP library and the webhook helper: a bug in our code (a stream read
# twice, a malformed URL we built), not a provider's answer; they pass through unchanged, as
# any bug does (``translate_sdk_errors``'s contract).
PASS_THROUGH = {
    "InvalidWebhookSignatureError",
    "CookieConflict",
    "InvalidURL",
    "StreamError",
    "StreamConsumed",
    "StreamClosed",
    "RequestNotRead",
    "ResponseNotRead",
}


def _vendor_classes() -> list[type[BaseException]]:
    found: set[type[BaseException]] = set()
    for module in (openai, anthropic, httpx2):
        for name in dir(module):
            obj = getattr(module, name)
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__.startswith(module.__name__):
                found.add(obj)
    return sorted(found, key=lambda c: (c.__module__, c.__qualname__))


def _vendor_instance(cls: type[BaseException], status: int = 503) -> BaseException:
    response = httpx2.Response(status, request=REQUEST, json={"error": {"message": "m"}})
    if issubclass(cls, openai.APIStatusError | anthropic.APIStatusError):
        if "message" not in inspect.signature(cls.__init__).parameters:  # e.g. OAuthError
            return cls(response=response, body=None)  # type: ignore[call-arg]
        return cls("m", response=response, body=None)
    if issubclass(cls, httpx2.HTTPStatusError):
        return cls("m", request=REQUEST, response=response)
    if issubclass(cls, openai.APIResponseValidationError | anthropic.APIResponseValidationError):
        return cls(response=response, body=None)
    if issubclass(cls, openai.APIError | anthropic.APIError):
        names = inspect.signature(cls.__init__).parameters
        kwargs: dict[str, Any] = {"request": REQUEST}
        if "message" in names:
            kwargs["message"] = "m"
        if "body" in names:
            kwargs["body"] = None
        return cls(**kwargs)
    if issubclass(cls, httpx2.RequestError):
        return cls("m", request=REQUEST)
    required = [
        p
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name != "self" and p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if not required:
        return cls()
    if len(required) == 1 and required[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
        return cls("m")
    # e.g. LengthFinishReasonError(completion=...): only its class matters for translation
    instance = cls.__new__(cls)
    BaseException.__init__(instance, "m")
    for p in required:
        setattr(instance, p.name, None)
    return instance


@pytest.mark.parametrize("cls", _vendor_classes(), ids=lambda c: f"{c.__module__.split('.')[0]}.{c.__qualname__}")
def test_no_vendor_error_escapes_the_judge(cls: type[BaseException]) -> None:
    """Every exception class the provider SDKs and their HTTP client define becomes a
    JudgeProviderError with a category (usage errors, i.e. our bugs, pass through unchanged)."""
    error = _vendor_instance(cls)
    if cls.__name__ in PASS_THROUGH:
        with pytest.raises(cls), translate_sdk_errors("openai", "openai/m"):
            raise error
        return
    with pytest.raises(JudgeProviderError) as info, translate_sdk_errors("openai", "openai/m"):
        raise error
    assert info.value.__cause__ is error
    assert info.value.category in CATEGORIES


def _otlp_line() -> str:
    # base64 ids: what protobuf's JSON mapping reads too (the decoder takes hex or base64)
    span = {
        "traceId": base64.b64encode(bytes(range(1, 17))).decode(),
        "spanId": base64.b64encode(bytes(range(1, 9))).decode(),
        "name": "agent",
        "kind": 1,
        "startTimeUnixNano": "1",
        "endTimeUnixNano": "2",
        "attributes": [{"key": "k", "value": {"stringValue": "v"}}],
        "status": {"code": 1},
    }
    return json.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {}, "spans": [span]}]}]})


def test_no_decoder_error_escapes_otlp() -> None:
    """Mangled OTLP (JSON and protobuf) decodes or raises OtlpDecodeError (invalid_input), never a
    JSON/protobuf/type error."""
    from tracing._errors import OtlpDecodeError

    rng = random.Random(11)
    line = _otlp_line()
    good = tracing.otlp.decode_otlp_json_line(line)
    proto = tracing.otlp.decode_otlp_protobuf(_protobuf_of(line))
    assert len(good) == len(proto) == 1
    data = _protobuf_of(line)
    errors: list[OtlpDecodeError] = []
    for _ in range(600):
        chars = list(line)
        for _ in range(rng.randint(1, 4)):
            chars[rng.randrange(len(chars))] = rng.choice('{}[]":,0a-9\\ ')
        raw = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        json_line, proto_bytes = "".join(chars), bytes(raw)
        for decode, value in (
            (tracing.otlp.decode_otlp_json_line, json_line),
            (tracing.otlp.decode_otlp_protobuf, proto_bytes),
        ):
            try:
                decode(value)  # type: ignore[arg-type]  # each decoder gets its own input type
            except OtlpDecodeError as exc:
                errors.append(exc)
    assert len(errors) > 100  # the mutations did reach the error paths
    assert {e.category for e in errors} == {"invalid_input"}


def _protobuf_of(line: str) -> bytes:
    from google.protobuf import json_format  # type: ignore[import-untyped]
    from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

    message = TracesData()
    json_format.Parse(line, message)
    return bytes(message.SerializeToString())


def test_no_redis_error_escapes_the_store() -> None:
    """A Redis that does not answer reaches store callers as StoreUnavailableError (retryable),
    and a run whose checkpoint write failed so is retried later, not recorded as failed."""
    from worker._errors import is_transient
    from worker._reconnect import StoreUnavailableError, reconnecting_client, unavailable_as_error

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    @unavailable_as_error
    class Store:
        reconnect_s = 0.3

        def __init__(self) -> None:
            self.client = reconnecting_client(
                f"redis://:pw@127.0.0.1:{port}/11", max_connections=2, reconnect_s=self.reconnect_s
            )

        async def get(self, key: str) -> Any:
            return await self.client.get(key)

    async def main() -> BaseException:
        store = Store()
        try:
            await store.get("k")
        except BaseException as exc:
            return exc
        finally:
            await store.client.aclose()
        raise AssertionError("a Redis that is not there answered")

    error = asyncio.run(main())
    assert type(error) is StoreUnavailableError
    assert error.category == "retryable"
    assert is_transient(_failed(error))


# --- one status table ------------------------------------------------------------------------


class _StepHttpError(Exception):
    """A step's own HTTP client error (not a judge call): only its ``status_code`` says anything."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status_code = status


STATUSES = sorted({408, 409, 425, 429, 529} | set(range(400, 600)))


@pytest.mark.parametrize("status", STATUSES)
def test_judge_retries_and_worker_redelivery_agree(status: int) -> None:
    """For every 4xx/5xx, the judge's StreamErrorRetryProcessor retries exactly when the worker
    would send a run failed by it (a judge's error, or a step's own HTTP error) round again."""
    from worker._errors import is_transient

    response = httpx2.Response(status, request=REQUEST, json={"error": {"message": "m"}})
    with pytest.raises(JudgeStatusError) as info, translate_sdk_errors("openai", "openai/m"):
        raise openai.APIStatusError("m", response=response, body={"error": {"message": "m"}})
    judge_error = info.value
    context = ErrorContext(JudgeCallInfo("s", "analyze", "openai/m", "openai"), retry_count=0, max_processor_retries=3)
    judge_retries = StreamErrorRetryProcessor(max_retries=3).process_error(judge_error, context).retry

    assert is_transient(_failed(judge_error)) == judge_retries
    assert is_transient(_failed(_StepHttpError(status))) == judge_retries
    assert judge_retries == (category_for_status(status) == "retryable")
    assert judge_retries == (status in (408, 409, 425, 429) or status >= 500)


def test_run_limits_and_bugs_are_final() -> None:
    """A run past its deadline or out of memory, and a bug in a step, are never redelivered;
    a builtin timeout or dropped connection in a step is."""
    from worker._errors import RunLimitError, is_transient

    assert not is_transient(RunLimitError("m", error_type="timeout"))
    assert RunLimitError("m", error_type="memory").category == "memory"
    assert not is_transient(_failed(KeyError("bug")))
    assert _failed(KeyError("bug")).category == "internal"
    assert is_transient(_failed(TimeoutError()))
    assert is_transient(_failed(ConnectionResetError()))
    assert not is_transient(None)


def test_a_steps_own_network_errors_are_retryable_whatever_library_raised_them() -> None:
    """A scorer step's own client errors (redis-py, requests/httpx-style) are worth another
    delivery, as they were before the error trees; a plain bug is not."""
    import redis.exceptions

    from worker._errors import is_transient

    class ConnectTimeout(Exception):  # the shape of httpx.ConnectTimeout / requests.ConnectTimeout
        pass

    assert is_transient(redis.exceptions.ConnectionError("Connection closed by server."))
    assert is_transient(redis.exceptions.TimeoutError("Timeout reading from socket"))
    assert is_transient(ConnectTimeout("timed out"))
    assert not is_transient(ValueError("not a network problem"))
    assert not is_transient(redis.exceptions.ResponseError("WRONGTYPE"))


def test_caused_by_finds_an_error_however_it_was_wrapped() -> None:
    """The worker's one walk of an error's causes: through ``raise from``, an error raised while
    handling another, and a failed step's ``cause``; a chain that loops ends."""
    from worker._errors import caused_by

    class Wanted(Exception):
        pass

    wanted = Wanted()
    step_failure = _failed(RuntimeError("wrapped"))
    assert step_failure.cause is not None
    step_failure.cause.__context__ = wanted
    outer = ValueError("outer")
    outer.__cause__ = step_failure  # raise ... from step_failure
    assert caused_by(outer, Wanted) is wanted
    assert caused_by(outer, (KeyError, ScorerRunError)) is step_failure
    assert caused_by(outer, KeyError) is None
    looped_a, looped_b = RuntimeError("a"), RuntimeError("b")
    looped_a.__cause__, looped_b.__context__ = looped_b, looped_a
    assert caused_by(looped_a, KeyError) is None
    assert caused_by(None, KeyError) is None
