"""Built-in judge models: ``"openai/<model>"`` and ``"anthropic/<model>"`` over the official
async SDKs, with the SDKs' own retries off (``max_retries=0``: retries are the judge's).

API keys and base URLs come from the SDKs' usual environment variables (``OPENAI_API_KEY``,
``OPENAI_BASE_URL``, ``ANTHROPIC_API_KEY``, ``ANTHROPIC_BASE_URL``) unless the Judge sets
``api_key=`` / ``base_url=``. The environment is read at call time, so a missing key fails the
call (``JudgeAuthError``), never the import.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from scorers._errors import ScorerConfigError
from scorers._result import JudgeUsage
from scorers._secrets import header_value_problem
from scorers.judge._body import (
    ACCEPTED_ENCODINGS,
    MAX_CHARS_PER_TOKEN,
    answer_cap,
    cap_response_body,
    over_values,
    values_bound,
)
from scorers.judge._clients import lease_client
from scorers.judge._errors import JudgeAuthError, JudgeProviderError, JudgeResponseError
from scorers.judge._model import JudgeModel, JudgeRequest, JudgeResponse
from scorers.judge._schema import strict_openai_schema
from scorers.judge._translate import error_in_answer, kept_request_id, translate_sdk_errors

if TYPE_CHECKING:
    import anthropic
    import httpx2
    import openai

__all__ = ["PROVIDERS", "AnthropicJudgeModel", "OpenAIJudgeModel", "model_secret", "resolve_model"]

PROVIDERS = ("openai", "anthropic")


def _sendable(key: str | None, source: str, provider: str, model_id: str) -> str | None:
    """``key``, unless an HTTP header cannot carry it: then a ``JudgeAuthError`` before any
    request, so the key never reaches the HTTP stack, whose own DEBUG log would print the
    header it refuses (the key with it)."""
    problem = header_value_problem(key) if key is not None else None
    if problem is None:
        return key
    raise JudgeAuthError(
        f"{model_id}: the API key from {source} {problem}; nothing was sent", provider=provider, model_id=model_id
    )


class OpenAIJudgeModel:
    """An OpenAI chat-completions model (or any OpenAI-compatible endpoint via ``base_url``)."""

    provider = "openai"
    supports_native_structured_output = True

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None) -> None:
        # Imported here, before any call's timeout starts: on a loaded machine the import took
        # longer than a judge's timeout, and the process's first call failed with nothing sent.
        import openai  # noqa: F401

        self.model = model
        self.model_id = f"openai/{model}"
        self.base_url = base_url
        self.api_key = api_key

    def __repr__(self) -> str:
        return f"OpenAIJudgeModel({self.model!r}, base_url={self.base_url!r})"

    def _api_key(self) -> str | None:
        source = "api_key=" if self.api_key else "OPENAI_API_KEY"
        return _sendable(self.secret(), source, self.provider, self.model_id)

    def _client(self) -> AbstractAsyncContextManager[openai.AsyncOpenAI]:
        """Lease a client; the environment is read per call so tests and rotations apply."""
        base_url = self.base_url or os.environ.get("OPENAI_BASE_URL") or None
        api_key = self._api_key()

        def build() -> openai.AsyncOpenAI:
            import openai

            # No redirect followed: it would send the prompt (the agent's content) to wherever the
            # answer points, another host included.
            http = openai.DefaultAsyncHttpxClient(
                headers=ACCEPTED_ENCODINGS, event_hooks={"response": [cap_response_body]}, follow_redirects=False
            )
            return openai.AsyncOpenAI(api_key=api_key, base_url=base_url, max_retries=0, http_client=http)

        return lease_client(("openai", base_url, api_key), build)

    async def generate(self, request: JudgeRequest) -> JudgeResponse:
        messages: list[dict[str, Any]] = [{"role": "system", "content": request.system}]
        messages += [{"role": m.role, "content": m.content} for m in request.messages]
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_completion_tokens": request.max_tokens,
        }
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.mode == "native" and request.output_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": request.schema_name,
                    "strict": True,
                    "schema": _strict(request.output_schema),
                },
            }
        with (
            translate_sdk_errors(self.provider, self.model_id, api_key=self._api_key()),
            answer_cap(request.max_tokens),
        ):
            # The SDK's generic POST (its documented way to send a raw body) rather than
            # chat.completions.create: create() runs a TypedDict transform over the params
            # that costs ~2 ms of CPU per call, the largest share of a judge call's overhead.
            # Transport, errors and response parsing are the SDK's own either way.
            async with self._client() as client:
                import httpx2

                raw = await client.post(
                    "/chat/completions",
                    body=body,
                    cast_to=httpx2.Response,
                    options={"timeout": request.timeout_s},
                )
        return self._read(raw, request.max_tokens)

    def _read(self, raw: httpx2.Response, max_tokens: int) -> JudgeResponse:
        """The parts of a chat completion the judge needs (json.loads; no model construction)."""
        request_id = kept_request_id(raw.headers.get("x-request-id"), self._api_key())
        paid: JudgeUsage | None = None  # what the answer says it used, once read
        try:
            data = _json_body(raw, max_tokens)
            usage = data.get("usage")
            failed = _error_in(self, data.get("error"), raw, request_id)
            if failed is not None:
                # What the call used upstream is paid for, though it failed there; a usage that
                # does not read leaves the error to say what went wrong.
                with contextlib.suppress(ValueError, TypeError):
                    failed.usage = _spent(_openai_usage(usage))
                raise failed
            paid = _openai_usage(usage)
            if not data.get("choices"):
                # No answer at all, not even a finish reason: the provider's (or a gateway's)
                # broken answer, not the judge's empty output. Read as one, it paid a fallback call.
                raise ValueError("the chat completion has no choices")
            choice = data["choices"][0]
            if isinstance(choice, dict) and (choice.get("error") or choice.get("finish_reason") == "error"):
                # An error met while the model answered (OpenRouter's): the choice's, its finish
                # reason "error", its content (if any) a part answer. Read as the answer, it was
                # an invalid output, a fallback call paid and an upstream 502 never retried.
                failed = _error_in(self, choice.get("error"), raw, request_id)
                if failed is None:
                    raise ValueError("the choice finished with an error (finish reason 'error')")
                failed.usage = _spent(paid)
                raise failed
            message = choice.get("message") or {}
            text = message.get("content") or ""
            if isinstance(text, list):  # content parts, as some OpenAI-compatible servers answer
                text = "".join(p["text"] for p in text if p.get("type") == "text" and isinstance(p.get("text"), str))
            elif not isinstance(text, str):  # (its repr was read as the answer: "not valid JSON")
                raise TypeError(f"message.content is a {type(text).__name__}, not text")
            finish_reason = choice.get("finish_reason")
            if not text and message.get("refusal"):  # no answer: the refusal's text is no reason
                text, finish_reason = str(message["refusal"]), "refusal"
            return JudgeResponse(
                text=str(text),
                usage=paid or JudgeUsage(),
                model=data.get("model"),
                request_id=request_id,
                finish_reason=finish_reason,
            )
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as exc:
            problem = _problem(exc, "the chat completion")
            raise _unreadable(self, problem, request_id, paid, raw.status_code) from exc

    def secret(self) -> str | None:
        """The API key its calls send, to mask wherever an answer quotes it."""
        return self.api_key or os.environ.get("OPENAI_API_KEY") or None


class AnthropicJudgeModel:
    """An Anthropic messages model; native structured output is a forced tool call."""

    provider = "anthropic"
    supports_native_structured_output = True

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None) -> None:
        import anthropic  # noqa: F401  (before any call's timeout, as for OpenAI)

        self.model = model
        self.model_id = f"anthropic/{model}"
        self.base_url = base_url
        self.api_key = api_key

    def __repr__(self) -> str:
        return f"AnthropicJudgeModel({self.model!r}, base_url={self.base_url!r})"

    def _api_key(self) -> str | None:
        source = "api_key=" if self.api_key else "ANTHROPIC_API_KEY"
        return _sendable(self.secret(), source, self.provider, self.model_id)

    def _client(self) -> AbstractAsyncContextManager[anthropic.AsyncAnthropic]:
        """Lease a client; the environment is read per call so tests and rotations apply."""
        base_url = self.base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
        api_key = self._api_key()

        def build() -> anthropic.AsyncAnthropic:
            import anthropic

            http = anthropic.DefaultAsyncHttpxClient(
                headers=ACCEPTED_ENCODINGS, event_hooks={"response": [cap_response_body]}, follow_redirects=False
            )
            return anthropic.AsyncAnthropic(api_key=api_key, base_url=base_url, max_retries=0, http_client=http)

        return lease_client(("anthropic", base_url, api_key), build)

    async def generate(self, request: JudgeRequest) -> JudgeResponse:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "max_tokens": request.max_tokens,
            "timeout": request.timeout_s,
        }
        if request.system:  # (an input processor may have removed it; an empty block is a 400)
            # The judge's instructions are the same for every run of a step: mark them as a
            # prompt-cache breakpoint (tools, then system, are the cached prefix). Anthropic
            # ignores it below the model's minimum cacheable length.
            kwargs["system"] = [{"type": "text", "text": request.system, "cache_control": {"type": "ephemeral"}}]
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
        tool = request.schema_name
        native = request.mode == "native" and request.output_schema is not None
        if native:
            kwargs["tools"] = [
                {
                    "name": tool,
                    "description": "Submit the evaluation. Call this tool with your answer.",
                    "input_schema": request.output_schema,
                }
            ]
            kwargs["tool_choice"] = {"type": "tool", "name": tool}
        with (
            translate_sdk_errors(self.provider, self.model_id, api_key=self._api_key()),
            answer_cap(request.max_tokens),
        ):
            async with self._client() as client:
                # The raw response (the SDK's request, transport and status errors all the same),
                # read as JSON here, as OpenAI's is: the SDK's parse built a model object per
                # content block, trying each block type for one it does not know (70 us a block:
                # 100,000 blocks of 1.5 MB held the event loop for 7 s).
                raw = await client.messages.with_raw_response.create(**kwargs)
        return self._read(raw.http_response, tool if native else None, request.max_tokens)

    def _read(self, raw: httpx2.Response, tool: str | None, max_tokens: int) -> JudgeResponse:
        """The parts of a message the judge needs (json.loads; no model construction)."""
        request_id = kept_request_id(raw.headers.get("request-id"), self._api_key())
        paid: JudgeUsage | None = None  # what the answer says it used, once read
        try:
            data = _json_body(raw, max_tokens)
            # (an error object of Anthropic's shape: its type "error")
            failed = _error_in(self, data.get("error"), raw, request_id)
            reported = data.get("usage")
            if failed is not None:
                # What the call used upstream is paid for, though it failed there (as for OpenAI).
                with contextlib.suppress(ValueError, TypeError):
                    failed.usage = None if reported is None else _spent(_anthropic_usage(reported))
                raise failed
            usage = _anthropic_usage(reported)
            paid = usage if reported is not None else None
            content = data.get("content")
            if not isinstance(content, list):
                raise TypeError(f"message.content is {_json_kind(content)}, not a list of blocks")
            parsed: Any = None
            texts: list[str] = []
            for block in content:
                if not isinstance(block, dict):
                    raise TypeError(f"message.content holds {_json_kind(block)}, not a block")
                kind = block.get("type")
                if kind == "tool_use" and tool is not None and block.get("name") == tool:
                    parsed = _tool_input(block.get("input"), max_tokens)
                elif kind == "text":
                    text = block.get("text")
                    if not isinstance(text, str):
                        raise TypeError(f"a text block's text is {_json_kind(text)}")
                    texts.append(text)
            if parsed is None:
                text = "".join(texts)
            else:
                try:
                    text = json.dumps(parsed)
                except RecursionError:  # refused by the judge's own reading, with its cost kept
                    text = ""
            return JudgeResponse(
                text=text,
                parsed=parsed,
                usage=usage,
                model=data.get("model"),
                request_id=request_id,
                finish_reason=data.get("stop_reason"),
            )
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as exc:
            raise _unreadable(self, _problem(exc, "the message"), request_id, paid, raw.status_code) from exc

    def secret(self) -> str | None:
        """The API key its calls send, to mask wherever an answer quotes it."""
        return self.api_key or os.environ.get("ANTHROPIC_API_KEY") or None


def _tool_input(value: Any, max_tokens: int) -> Any:
    """A forced tool call's ``input``; sent as the JSON text of an object (as some translating
    proxies do, OpenAI's ``arguments`` form), that object: read as text it failed the schema and
    cost a fallback call. Text longer than ``max_tokens`` allows is not parsed (its values are
    not bounded by the body's count): the judge refuses it as too long, its usage counted."""
    if not isinstance(value, str) or len(value) > max_tokens * MAX_CHARS_PER_TOKEN:
        return value
    try:
        data = json.loads(value)
    except (ValueError, RecursionError):
        return value
    return data if isinstance(data, dict) else value


# More tokens than any model's context takes in one request: a number past it is a broken answer.
MAX_CALL_TOKENS = 100_000_000


def token_count(raw: Any, field: str) -> int:
    """A provider's token count read once, where its answer is read: missing is 0; anything but
    a whole number in 0..MAX_CALL_TOKENS (negative, fractional, a string, a bool) is a
    ``ValueError`` naming the field, which the caller turns into a ``JudgeResponseError``, so a
    broken usage never reaches the price table and the budgets (a negative cost would reopen a
    spent budget)."""
    if raw is None:
        return 0
    whole = isinstance(raw, int) or (isinstance(raw, float) and math.isfinite(raw) and raw.is_integer())
    if isinstance(raw, bool) or not whole:
        shown = repr(raw)[:40] if isinstance(raw, int | float) and not isinstance(raw, bool) else _json_kind(raw)
        raise ValueError(f"{field} is {shown}, not a token count")
    if not 0 <= raw <= MAX_CALL_TOKENS:
        raise ValueError(f"{field} is {int(raw)}, not a token count (0..{MAX_CALL_TOKENS:,})")
    return int(raw)


def _openai_usage(usage: Any) -> JudgeUsage | None:
    """A chat completion's ``usage`` read (None when it reports none); a ``ValueError`` or
    ``TypeError`` naming the field that does not read."""
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise TypeError(f"usage is {_json_kind(usage)}, not an object")
    details = usage.get("prompt_tokens_details") or {}
    if not isinstance(details, dict):
        raise TypeError(f"usage.prompt_tokens_details is {_json_kind(details)}, not an object")
    prompt = token_count(usage.get("prompt_tokens"), "usage.prompt_tokens")
    # OpenAI caches prompt prefixes by itself (≥ 1024 tokens): the system message (the judge's
    # instructions) comes first so every run shares it. No more of the prompt is cached than the
    # prompt (a broken server said more; the price table held that too).
    cached = token_count(details.get("cached_tokens"), "usage.prompt_tokens_details.cached_tokens")
    return JudgeUsage(
        input_tokens=prompt,
        output_tokens=token_count(usage.get("completion_tokens"), "usage.completion_tokens"),
        cached_input_tokens=min(cached, prompt),
    )


def _spent(usage: JudgeUsage | None) -> JudgeUsage | None:
    """The usage an error answer reports, if it says tokens were used: then the call is paid for.
    A usage of nothing beside an error (a gateway's upstream that failed before any token) is a
    failed call's, counted against the run's cap as any failed call is."""
    return usage if usage is not None and usage.total_tokens > 0 else None


def _json_body(raw: httpx2.Response, max_tokens: int) -> dict[str, Any]:
    """A 200's body as a JSON object; else a ``ValueError`` or ``TypeError`` saying what it is
    (an HTML page, a stream's events, bytes of another charset, more values than an answer within
    ``max_tokens`` holds), never its text."""
    bound = values_bound(max_tokens)
    if over_values(raw.content, bound):
        # Refused before json.loads builds it: its usage, inside, cannot be read.
        raise ValueError(
            f"the body holds more JSON values than an answer within max_tokens={max_tokens} "
            f"could ({bound:,}): not parsed ({len(raw.content):,} bytes)"
        )
    try:
        data = json.loads(raw.content)
    except ValueError:
        kind = raw.headers.get("content-type", "no content type").split(";")[0][:60]
        raise ValueError(f"the body is not JSON ({kind}, {len(raw.content):,} bytes)") from None
    except RecursionError:
        raise ValueError(f"the body is nested too deeply to read ({len(raw.content):,} bytes)") from None
    if not isinstance(data, dict):
        raise TypeError(f"the body is {_json_kind(data)}, not an object")
    return data


def _anthropic_usage(usage: Any) -> JudgeUsage:
    """Anthropic's ``input_tokens`` are only the tokens after the last cache breakpoint; the
    cache reads and writes come separately. Ours counts the whole prompt (as OpenAI does), with
    the reads and writes as shares of it."""
    if usage is None:  # none reported (a local model): it costs nothing
        return JudgeUsage()
    if not isinstance(usage, dict):
        raise TypeError(f"usage is {_json_kind(usage)}, not an object")
    read = token_count(usage.get("cache_read_input_tokens"), "usage.cache_read_input_tokens")
    written = token_count(usage.get("cache_creation_input_tokens"), "usage.cache_creation_input_tokens")
    return JudgeUsage(
        input_tokens=token_count(usage.get("input_tokens"), "usage.input_tokens") + read + written,
        output_tokens=token_count(usage.get("output_tokens"), "usage.output_tokens"),
        cached_input_tokens=read,
        cache_write_input_tokens=written,
    )


_strict_cache: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """``strict_openai_schema``, cached by identity (a step sends the same schema each run)."""
    hit = _strict_cache.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    strict = strict_openai_schema(schema)
    if len(_strict_cache) > 1024:
        _strict_cache.clear()
    _strict_cache[id(schema)] = (schema, strict)
    return strict


def model_secret(model: JudgeModel) -> str | None:
    """The API key a built-in model sends (None for a custom model: its secrets are its own)."""
    return model.secret() if isinstance(model, OpenAIJudgeModel | AnthropicJudgeModel) else None


_resolved: dict[tuple[str, str | None, str | None], JudgeModel] = {}


def resolve_model(model: str | JudgeModel, *, base_url: str | None, api_key: str | None) -> JudgeModel:
    """``"openai/<model>"`` / ``"anthropic/<model>"`` → a built-in model; objects pass through."""
    if not isinstance(model, str):
        return model
    key = (model, base_url, api_key)
    found = _resolved.get(key)
    if found is not None:
        return found
    provider, _, name = model.partition("/")
    built: JudgeModel
    if provider == "openai" and name:
        built = OpenAIJudgeModel(name, base_url=base_url, api_key=api_key)
    elif provider == "anthropic" and name:
        built = AnthropicJudgeModel(name, base_url=base_url, api_key=api_key)
    else:
        raise ScorerConfigError(
            f"judge model {model!r} is not understood: use 'openai/<model>', "
            "'anthropic/<model>', or an object implementing scorers.judge.JudgeModel"
        )
    _resolved[key] = built
    return built


def _error_in(
    model: OpenAIJudgeModel | AnthropicJudgeModel, error: Any, raw: httpx2.Response, request_id: str | None
) -> JudgeProviderError | None:
    """``error_in_answer`` for an error ``model``'s 200 answer ``raw`` carries (its body's or its
    choice's), read with that answer's headers (a Retry-After) and the key its call sent masked."""
    return error_in_answer(
        error, model.provider, model.model_id, request_id=request_id, api_key=model._api_key(), headers=raw.headers
    )


def _unreadable(
    model: OpenAIJudgeModel | AnthropicJudgeModel,
    problem: str,
    request_id: str | None,
    paid: JudgeUsage | None,
    status_code: int | None = None,
) -> JudgeResponseError:
    """The error for an answer ``model`` cannot use (``problem``, which names types and sizes,
    never the body's text: it may be the agent's content, or the key a proxy echoed), with
    ``paid``, the usage the answer reported, if it did."""
    err = JudgeResponseError(
        f"{model.model_id}: {problem}",
        provider=model.provider,
        model_id=model.model_id,
        status_code=status_code,
        request_id=request_id,
    )
    err.usage = paid
    return err


def _problem(exc: BaseException, what: str) -> str:
    """Why ``what`` (the chat completion, the message) could not be read: this module's own words
    (which name types and sizes), else the Python error's, which name types and keys only."""
    said = str(exc)
    if said.startswith(what):
        return said
    if _OWN.match(said):
        return f"{what} could not be read: {said}"
    return f"{what} could not be read ({type(exc).__name__}: {said})"


def _json_kind(value: Any) -> str:
    """What a JSON value is, in words (never the value itself)."""
    if isinstance(value, str | bytes):
        return f"text ({len(value):,} characters)"
    if isinstance(value, list):
        return "a JSON array"
    if isinstance(value, bool):
        return "a JSON boolean"
    if isinstance(value, int | float):
        return "a JSON number"
    if value is None:
        return "null"
    return f"a {type(value).__name__}"


# Problems this module words itself (they start so): said as they are, not as a Python exception.
_OWN = re.compile(r"(the body|the choice|usage|message\.content|a text block)\b")
