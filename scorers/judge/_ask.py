"""One judge question: prompt in, validated answer out, with processors, retries and records.

Flow of ``ask_judge`` (one prompt step's judge call):

1. resolve the model; messages = system (preamble + instructions) + the user prompt;
   input processors transform them once.
2. each attempt: build the request for the current mode (native / system / inline / free
   text), send it through the host's hooks (limiter slot held during the request,
   ``call_context`` entered around it, usage recorded after, the model paused on a 429 with
   Retry-After).
3. a provider error goes to the error processors; a retry decision within
   ``max_processor_retries`` waits its delay and tries again, anything else is final.
4. a response goes through the output processors, is parsed and validated; native output
   that fails is retried once with the schema in the system message; a final failure is a
   ``JudgeOutputError`` naming the model, the step and what was wrong.

Every attempt is recorded in the ``JudgeExecution``; on failure the raised error carries it
as ``.execution`` and is the original provider error (status, request id).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from scorers._errors import ScorerConfigError
from scorers._json import json_ready, well_formed
from scorers._result import JudgeAttempt, JudgeExecution, JudgeUsage, StepName
from scorers.judge._body import MAX_CHARS_PER_TOKEN
from scorers.judge._config import Judge
from scorers.judge._errors import (
    JudgeError,
    JudgeOutputError,
    JudgeProcessorError,
    JudgeProviderError,
    JudgeRateLimitError,
    JudgeResponseError,
    JudgeTimeoutError,
)
from scorers.judge._hooks import JudgeCallRefused, JudgeHooks, JudgeLimiter, get_judge_hooks
from scorers.judge._model import JudgeMessage, JudgeModel, JudgeRequest, JudgeResponse
from scorers.judge._processors import ErrorContext, JudgeCallInfo, RetryDecision
from scorers.judge._providers import model_secret, resolve_model
from scorers.judge._request import (
    WRAP_KEY,
    Mode,
    base_messages,
    build_request,
    initial_mode,
    output_spec,
)
from scorers.judge._schema import OutputSpec, SchemaMismatch, drop_optional_nulls, parse_json_text
from scorers.judge._translate import scrub_secrets

__all__ = ["MAX_PAUSE_S", "JudgeAnswer", "ask_judge"]

log = structlog.get_logger("scorers.judge")

# A 429's Retry-After pauses every caller of the model through the limiter, capped here so a
# bogus header cannot stall a worker for hours.
MAX_PAUSE_S = 60.0
# The SDKs bound each read, not the exchange: a provider (or a proxy) dripping its answer a
# byte at a time never times out there. This guard bounds each attempt at the judge's timeout
# plus a moment for the SDK's own timeout error to come first (it held 5 s more once), and
# catches a custom JudgeModel that never returns.
_TIMEOUT_GRACE_S = 0.5


@dataclass(frozen=True, slots=True)
class JudgeAnswer:
    """``value``: the validated answer (a model instance, a dict, or the text for free text)."""

    value: Any
    execution: JudgeExecution


async def ask_judge(
    *,
    scorer_id: str,
    step: StepName,
    judge: Judge | None,
    prompt: str,
    output_schema: type[Any] | Mapping[str, Any] | None,
) -> JudgeAnswer:
    """Ask the judge; ``output_schema=None`` asks for free text.

    Raises ``ScorerConfigError`` when the judge is not usable, otherwise a ``JudgeError``
    carrying ``.execution`` (a ``JudgeExecution`` with status "error").
    """
    where = f"scorer {scorer_id!r} step {step}"
    if judge is None or judge.model is None:
        raise ScorerConfigError(
            f"{where}: a prompt step needs a judge model; pass create_scorer(..., "
            "judge=Judge(model='openai/<model>', ...)) or PromptStep(..., judge=Judge(...))"
        )
    model = resolve_model(judge.model, base_url=judge.base_url, api_key=judge.api_key)
    spec = output_spec(output_schema) if output_schema is not None else None
    mode = initial_mode(judge, model, spec, where)
    call = _JudgeCall(
        judge=judge,
        model=model,
        spec=spec,
        info=JudgeCallInfo(scorer_id, step, model.model_id, model.provider),
        hooks=get_judge_hooks(),
        prompt=prompt,
        step=step,
    )
    return await call.run(mode)


class _JudgeCall:
    def __init__(
        self,
        *,
        judge: Judge,
        model: JudgeModel,
        spec: OutputSpec | None,
        info: JudgeCallInfo,
        hooks: JudgeHooks,
        prompt: str,
        step: StepName,
    ) -> None:
        self.judge = judge
        self.model = model
        self.spec = spec
        self.info = info
        self.hooks = hooks
        self.prompt = prompt
        self.sent_prompt = prompt
        self.attempts: list[JudgeAttempt] = []
        self.usage = JudgeUsage()
        self.started = time.perf_counter()
        self.raw_output: str | None = None
        self.where = f"scorer {info.scorer_id!r} step {info.step}"
        self.log = log.bind(scorer=info.scorer_id, model=info.model_id, step=info.step)
        self.step = step
        self.secret = model_secret(model)

    async def run(self, mode: Mode) -> JudgeAnswer:
        try:
            return await self._run(mode)
        except asyncio.CancelledError as cancelled:
            # The run's timeout (or a shutdown) can land after answers were paid for: they go
            # with the cancellation, for the run's record to carry (it said 0 calls, 0 cost).
            if self.attempts:
                cancelled.execution = self._execution("error", error="cancelled")  # type: ignore[attr-defined]
            raise

    async def _run(self, mode: Mode) -> JudgeAnswer:
        try:
            messages = await self._input(base_messages(self.judge, self.prompt))
        except JudgeError as exc:
            raise self._fail(exc) from exc.__cause__
        # Traced text may hold lone surrogates (a truncated emoji): no SDK can encode them.
        messages = [JudgeMessage(m.role, well_formed(m.content)) for m in messages]
        users = [m.content for m in messages if m.role == "user"]
        self.sent_prompt = users[-1] if users else ""
        cap = self.judge.effective_max_processor_retries
        retries = 0
        fell_back = False
        while True:
            request = build_request(self.judge, messages, self.spec, mode)
            began = time.perf_counter()
            try:
                response = await self._send(request)
            except JudgeCallRefused as refused:
                # Expected for every call until a budget resets: the run's record names it, the
                # summaries count it, a worker logs its letters once a minute. A warning a call
                # flooded a backfill's terminal.
                self.log.debug("judge.refused", reason=refused.error_type)
                raise self._fail(refused) from None
            except JudgeProviderError as err:
                if err.usage is not None:  # an answer it could not use, paid for (counted in _send)
                    self.usage = self.usage + err.usage
                attempt = self._record_error(err, began, mode, usage=err.usage)
                retries = await self._retry_or_raise(err, attempt, retries, cap)
                continue
            if response.finish_reason != (known := _known(response.finish_reason)):
                response = dataclasses.replace(response, finish_reason=known)
            too_long = self._too_long(request, response)
            if too_long is not None:  # paid for (the limiter and the guard counted it), not kept
                self.usage = self.usage + response.usage
                self._record_error(too_long, began, mode, usage=response.usage)
                self.log.warning("judge.failed", status=None, retries=retries, reason="too_long")
                raise self._fail(too_long)
            empty = self._no_content(response)
            if empty is not None:  # paid for, as above; then an unreadable answer, no fallback
                self.usage = self.usage + response.usage
                attempt = self._record_error(empty, began, mode, usage=response.usage)
                attempt.finish_reason = response.finish_reason
                retries = await self._retry_or_raise(empty, attempt, retries, cap)
                continue
            attempt = self._record_ok(response, began, mode)
            try:
                response = await self._output(response)
                value = self._validate(response, mode)
            except (ValueError, SchemaMismatch) as problem:
                attempt.status = "error"
                attempt.error = scrub_secrets(f"invalid answer: {problem}", self.secret)
                attempt.error_type = "JudgeOutputError"
                if mode == "native" and not fell_back:
                    fell_back = True
                    mode = "system"
                    self.log.info("judge.fallback", **_problem_fields(problem, self.spec))
                    continue
                # from None: a traceback would print the problem with its values (see below).
                raise self._fail(self._output_error(problem, response, fell_back)) from None
            except JudgeError as exc:
                raise self._fail(exc) from exc.__cause__
            return JudgeAnswer(value, self._execution("ok", output=json_ready(value)))

    async def _retry_or_raise(self, err: JudgeProviderError, attempt: JudgeAttempt, retries: int, cap: int) -> int:
        """The retry count after waiting for the retry the error processors ask for, else the
        failure raised."""
        decision = await self._decide(err, retries, cap)
        if decision is None or not decision.retry or retries >= cap:
            self.log.warning(
                "judge.failed", status=err.status_code, retries=retries, reason=_why_final(decision, retries, cap)
            )
            raise self._fail(err) from err.__cause__
        attempt.retry_delay_ms = decision.delay_ms
        self.log.info("judge.retry", status=err.status_code, retry=retries + 1, delay_ms=decision.delay_ms)
        await self.hooks.wait(decision.delay_ms / 1000)
        return retries + 1

    # --- one provider request, through the host's hooks ----------------------------------

    async def _send(self, request: JudgeRequest) -> JudgeResponse:
        model_id = self.info.model_id
        limiter = self.hooks.limiter
        enter = self.hooks.call_context
        guard = self.hooks.guard
        if guard is not None:
            await guard.before_call(model_id, self.info.scorer_id)
        try:
            if limiter is not None:
                async with limiter.slot(model_id, _estimate_tokens(request)):
                    response = await self._generate(request, enter)
            else:
                response = await self._generate(request, enter)
        except JudgeProviderError as err:
            pause = err.retry_after_ms if isinstance(err, JudgeRateLimitError) else None
            pause_s = None if pause is None else min(pause / 1000, MAX_PAUSE_S)
            if err.usage is not None:
                # An answer that could not be used (no choices, say) but said what it used: paid
                # for as any answer, not a failed call against the run's cap. A 429 among them
                # still pauses the model (its pause was dropped here: every caller went on).
                await self._paid(err.usage, pause_s)
                raise
            if guard is not None:
                await guard.call_failed(model_id, self.info.scorer_id, err)
            if limiter is not None:
                await self._tell_limiter(limiter, 0, pause_s)
            raise
        await self._paid(response.usage)
        return response

    async def _paid(self, usage: JudgeUsage, pause_s: float | None = None) -> None:
        """An answer is paid for: the guard counts it first, and the limiter's correction can
        only be lost, never lose the answer (a failed run would be redelivered and paid again)."""
        if self.hooks.guard is not None:
            await self.hooks.guard.after_call(self.info.model_id, self.info.scorer_id, usage)
        if self.hooks.limiter is not None:
            await self._tell_limiter(self.hooks.limiter, usage.total_tokens, pause_s)

    async def _tell_limiter(self, limiter: JudgeLimiter, tokens: int, pause_s: float | None) -> None:
        """The tokens a finished request used, and the provider's pause: corrections to the
        limiter's estimate, which a store that is away only leaves uncorrected."""
        model_id = self.info.model_id
        try:
            await limiter.record_usage(model_id, tokens)
        except Exception as exc:
            self.log.warning("judge.limiter_not_updated", what="usage", error_type=type(exc).__name__, tokens=tokens)
        if pause_s is None:
            return
        try:
            await limiter.pause(model_id, pause_s)
        except Exception as exc:
            self.log.warning("judge.limiter_not_updated", what="pause", error_type=type(exc).__name__, seconds=pause_s)

    async def _generate(self, request: JudgeRequest, enter: Any) -> JudgeResponse:
        context = enter(self.info.model_id) if enter is not None else contextlib.nullcontext()
        with context:
            try:
                async with asyncio.timeout(request.timeout_s + _TIMEOUT_GRACE_S):
                    response = await self.model.generate(request)
            except JudgeProviderError:
                raise
            except TimeoutError as exc:
                raise JudgeTimeoutError(
                    f"{self.info.model_id}: no answer within {request.timeout_s:g}s",
                    provider=self.info.provider,
                    model_id=self.info.model_id,
                ) from exc
            except Exception as exc:
                # A custom JudgeModel raised something of its own: an "unknown" error for
                # retry policies, with the original kept as __cause__.
                raise JudgeProviderError(
                    scrub_secrets(f"{self.info.model_id}: {type(exc).__name__}: {exc}"),
                    provider=self.info.provider,
                    model_id=self.info.model_id,
                ) from exc
        if not isinstance(response, JudgeResponse):
            raise JudgeProviderError(
                f"{self.info.model_id}: generate() returned {type(response).__name__}, "
                "expected a scorers.judge.JudgeResponse",
                provider=self.info.provider,
                model_id=self.info.model_id,
            )
        return response

    def _too_long(self, request: JudgeRequest, response: JudgeResponse) -> JudgeResponseError | None:
        """An answer longer than ``max_tokens`` can hold, as text or as the parsed object a
        custom model may give alone: the error that refuses it, else None."""
        size = len(response.text)
        if response.parsed is not None:
            with contextlib.suppress(RecursionError):  # too deep to measure: refused when read
                size = max(size, len(json.dumps(response.parsed, default=str)))
        bound = request.max_tokens * MAX_CHARS_PER_TOKEN
        if size <= bound:
            return None
        return JudgeResponseError(
            f"{self.info.model_id}: the answer is {size:,} characters, more than "
            f"max_tokens={request.max_tokens} allows ({bound:,}): not kept",
            provider=self.info.provider,
            model_id=self.info.model_id,
            request_id=response.request_id,
        )

    def _no_content(self, response: JudgeResponse) -> JudgeResponseError | None:
        """The error for an answer with nothing in it (no text, no structured answer: Anthropic's
        ``content: []``, a thinking block alone, OpenAI's null content) whose finish reason says
        it is whole, else None. An empty answer with a reason (a content filter, a tool call in
        place of text, the token limit) is the judge's output, refused in ``_validate``; this one
        is the provider answering nothing, as a chat completion without choices is."""
        if response.parsed is not None or response.text.strip() or response.finish_reason not in _WHOLE:
            return None
        return JudgeResponseError(
            f"{self.info.model_id}: the answer has no content (finish reason {response.finish_reason!r}): "
            "no text and no structured answer",
            provider=self.info.provider,
            model_id=self.info.model_id,
            request_id=response.request_id,
        )

    # --- processors ------------------------------------------------------------------------

    async def _input(self, messages: list[JudgeMessage]) -> list[JudgeMessage]:
        for processor in self.judge.input_processors:
            result = await _call(processor, "process_input", messages, self.info, self.where)
            if not isinstance(result, list) or not all(isinstance(m, JudgeMessage) for m in result):
                raise JudgeProcessorError(
                    f"{self.where}: input processor {processor!r} must return a list of "
                    f"JudgeMessage, got {type(result).__name__}"
                )
            messages = result
        return messages

    async def _output(self, response: JudgeResponse) -> JudgeResponse:
        for processor in self.judge.output_processors:
            result = await _call(processor, "process_output", response, self.info, self.where)
            if not isinstance(result, JudgeResponse):
                raise JudgeProcessorError(
                    f"{self.where}: output processor {processor!r} must return a JudgeResponse, "
                    f"got {type(result).__name__}"
                )
            response = result
        return response

    async def _decide(self, err: JudgeProviderError, retries: int, cap: int) -> RetryDecision | None:
        context = ErrorContext(self.info, retries, cap)
        for processor in self.judge.error_processors:
            try:
                decision = await _call(processor, "process_error", err, context, self.where)
            except JudgeError as exc:  # any judge error a processor raises, not only wrapped ones
                raise self._fail(exc) from exc.__cause__
            if decision is not None:
                if not isinstance(decision, RetryDecision):
                    raise self._fail(
                        JudgeProcessorError(
                            f"{self.where}: error processor {processor!r} must return a "
                            f"RetryDecision or None, got {type(decision).__name__}"
                        )
                    ) from err
                return decision
        return None

    # --- answers ---------------------------------------------------------------------------

    def _validate(self, response: JudgeResponse, mode: Mode) -> Any:
        # Both providers: OpenAI's message.refusal (read as finish_reason "refusal") and
        # Anthropic's stop_reason "refusal". A refusal's text made a reason step "succeed".
        if response.finish_reason == "refusal":
            raise ValueError("the judge refused to answer")
        if response.parsed is None and not response.text.strip() and response.finish_reason not in _SAYS_NOTHING:
            # The provider said why there is nothing (a content filter, a tool call in place of
            # text): "the answer is empty" alone hid it.
            raise ValueError(f"the answer is empty (finish reason {response.finish_reason!r})")
        if self.spec is None:
            text = _clean_text(response.text, self.secret).strip()
            if not text:
                # (a reasoning model that spent its max_tokens thinking answers no text)
                cut = response.finish_reason in _CUT_SHORT
                raise ValueError(
                    "the answer is empty"
                    + (
                        f": cut at the output token limit (finish reason {response.finish_reason!r}; raise max_tokens)"
                        if cut
                        else ""
                    )
                )
            if response.finish_reason in _CUT_SHORT:
                # Kept (most of a reason beats none); the attempt's finish_reason says so.
                self.log.warning("judge.cut_short", finish_reason=response.finish_reason)
            return text
        try:
            data = response.parsed if response.parsed is not None else parse_json_text(response.text)
        except ValueError as exc:
            if response.finish_reason in _CUT_SHORT:  # say why the JSON broke off
                raise ValueError(f"the answer was cut at the token limit ({response.finish_reason}): {exc}") from None
            raise
        data = _clean(data, self.secret)
        if mode == "native":
            if not self.spec.is_object:
                if not isinstance(data, dict) or WRAP_KEY not in data:
                    raise ValueError(f"the answer has no {WRAP_KEY!r} field")
                data = data[WRAP_KEY]
            data = drop_optional_nulls(data, self.spec.json_schema)
        return self.spec.validate(data)

    def _output_error(self, problem: Exception, response: JudgeResponse, fell_back: bool) -> JudgeOutputError:
        after = " (also after retrying with the schema in the system message)" if fell_back else ""
        what = "does not fit the output schema" if isinstance(problem, SchemaMismatch) else "could not be read"
        # The answer described, not quoted (as an unreadable provider body is): a judge's answer
        # quotes the agent, and this text goes wherever the error is shown or logged with its
        # traceback; the answer itself is the error's raw_output, and the step record's. A schema
        # problem is told by place and kind, as the fallback's log line tells it.
        told = _described(problem, self.spec) if isinstance(problem, SchemaMismatch) else str(problem)
        return JudgeOutputError(
            scrub_secrets(
                f"{self.where}: the answer of judge model {self.info.model_id} "
                f"({len(response.text):,} characters) {what}{after}: {told}",
                self.secret,
            ),
            model_id=self.info.model_id,
            step=self.info.step,
            raw_output=self.raw_output,
        )

    # --- records ---------------------------------------------------------------------------

    def _record_ok(self, response: JudgeResponse, began: float, mode: Mode) -> JudgeAttempt:
        self.usage = self.usage + response.usage
        self.raw_output = _clean_text(response.text, self.secret)
        attempt = JudgeAttempt(
            status="ok",
            duration_ms=(time.perf_counter() - began) * 1000,
            usage=response.usage,
            request_id=response.request_id,
            prompt_injection=mode,
            finish_reason=response.finish_reason,
        )
        self.attempts.append(attempt)
        return attempt

    def _record_error(
        self, err: JudgeProviderError, began: float, mode: Mode, *, usage: JudgeUsage | None = None
    ) -> JudgeAttempt:
        attempt = JudgeAttempt(
            status="error",
            duration_ms=(time.perf_counter() - began) * 1000,
            usage=usage,
            error=str(err),
            error_type=type(err).__name__,
            status_code=err.status_code,
            request_id=err.request_id,
            prompt_injection=mode,
        )
        self.attempts.append(attempt)
        return attempt

    def _execution(
        self, status: Literal["ok", "error"], *, output: Any = None, error: str | None = None
    ) -> JudgeExecution:
        return JudgeExecution(
            step=self.step,
            status=status,
            prompt=self.sent_prompt,
            output=output,
            raw_output=self.raw_output,
            model=self.info.model_id,
            provider=self.info.provider,
            usage=self.usage,
            attempt_count=len(self.attempts),
            duration_ms=(time.perf_counter() - self.started) * 1000,
            error=error,
            attempts=list(self.attempts),
        )

    def _fail(self, exc: JudgeError) -> JudgeError:
        exc.execution = self._execution("error", error=f"{type(exc).__name__}: {exc}")
        return exc


async def _call(processor: Any, method: str, first: Any, second: Any, where: str) -> Any:
    fn = getattr(processor, method, None)
    fn = fn if callable(fn) else processor
    try:
        result = fn(first, second)
        if inspect.isawaitable(result):
            result = await result
    except JudgeError:
        raise
    except Exception as exc:
        raise JudgeProcessorError(f"{where}: {method} of {processor!r} raised {type(exc).__name__}: {exc}") from exc
    return result


def _why_final(decision: RetryDecision | None, retries: int, cap: int) -> str:
    if decision is None:
        return "no error processor asked for a retry"
    if decision.retry and retries >= cap:
        return f"max_processor_retries ({cap}) reached"
    return decision.reason or "an error processor declined to retry"


# Finish reasons of an answer cut at the output token limit (OpenAI, Anthropic).
_CUT_SHORT = frozenset({"length", "max_tokens"})
# Finish reasons of a whole answer (None: the provider gave none).
_WHOLE = frozenset({None, "stop", "end_turn"})
# Finish reasons that say nothing about an empty answer: a whole one, or one cut short (said so).
_SAYS_NOTHING = _WHOLE | _CUT_SHORT


def _known(finish_reason: object) -> str | None:
    """A provider's finish reason as kept: a short word ("stop", "length", "end_turn", ...),
    else "other" (a broken proxy may send anything: megabytes, a number, an object)."""
    if finish_reason is None or (
        isinstance(finish_reason, str)
        and len(finish_reason) <= 32
        and finish_reason.isascii()
        and finish_reason.isidentifier()
    ):
        return finish_reason
    return "other"


def _problem_fields(problem: Exception, spec: OutputSpec | None) -> dict[str, Any]:
    """Why an answer did not fit, for a log line: where in the answer (up to 8 places), never the
    answered values (a claims step's answer is the agent's own text), nor a key the answer made
    up (it may be the agent's words too): a place through one is logged as such. The error
    record keeps the whole problem, for whoever reads the scores."""
    if isinstance(problem, SchemaMismatch):
        known = spec.property_names if spec is not None else frozenset()
        return {
            "problem": "does not fit the output schema",
            "at": [_schema_place(place, known) for place, _ in problem.described[:8]],
        }
    return {"problem": str(problem)}  # parse errors: a position and a parser message only


def _described(problem: SchemaMismatch, spec: OutputSpec | None) -> str:
    """The problems without the values that failed, each at its place as ``_problem_fields``
    logs it (a key the answer made up is no place to name)."""
    known = spec.property_names if spec is not None else frozenset()
    told = "; ".join(f"{_schema_place(place, known)}: {what}" for place, what in problem.described[:8])
    return told + (" ..." if len(problem.described) > 8 else "")


_PATH_SEPARATORS = re.compile(r"[.\[\]]+")
_LIST_INDEX = re.compile(r"\[\d+\]")


def _schema_place(path: str, known: frozenset[str]) -> str:
    """``path`` when each step of it is a property the schema names, a list index (``[n]``) or
    the root: a key the answer made up of digits (a phone number) is no index."""
    steps = [s for s in _PATH_SEPARATORS.split(_LIST_INDEX.sub("", path)) if s]
    if all(s in known or s == "(root)" for s in steps):
        return path
    return "(a property the schema does not name)"


# Deeper than any judge's answer needs to nest: past it an answer is refused before it is walked.
MAX_ANSWER_DEPTH = 100


# A key shorter than this is a local server's placeholder ("none", "ollama", "lm-studio"), no
# secret: masked, it rewrote answers ("none of the claims hold" as "*** of the claims hold").
_MIN_ECHOED_KEY = 16


def _clean_text(text: str, secret: str | None) -> str:
    """An answer's text as kept: valid Unicode (a lone surrogate, which no JSON writer takes,
    as U+FFFD) and without the API key the call sent, should the provider echo it."""
    text = well_formed(text)
    if secret and len(secret) >= _MIN_ECHOED_KEY and secret in text:
        return text.replace(secret, "***")
    return text


def _clean(value: Any, secret: str | None, depth: int = 0) -> Any:
    """A parsed answer with ``_clean_text`` applied to every string, keys included; a
    ``ValueError`` past ``MAX_ANSWER_DEPTH`` levels (Python's recursion limit is not far)."""
    if isinstance(value, str):
        return _clean_text(value, secret)
    if isinstance(value, dict | list) and depth >= MAX_ANSWER_DEPTH:
        raise ValueError(f"the answer is nested more than {MAX_ANSWER_DEPTH} levels deep")
    if isinstance(value, dict):
        return {
            _clean_text(k, secret) if isinstance(k, str) else k: _clean(v, secret, depth + 1) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_clean(v, secret, depth + 1) for v in value]
    return value


def _estimate_tokens(request: JudgeRequest) -> int:
    """A rough prompt-size estimate (4 characters a token) plus the answer budget."""
    chars = len(request.system) + sum(len(m.content) for m in request.messages)
    return chars // 4 + min(request.max_tokens, 512)
