"""The one secret scrubber: every text that may quote a credential (a provider's error body, a
broker or store URL, a sink's or Tempo's refusal) goes through ``scrub_secrets`` before a log,
an error, a stored record or a dead letter can take it.

One scrubber, so every call site knows every shape: a provider error can quote a
``redis://:pw@`` URL just as a Tempo or OTLP error can echo ``Authorization: Bearer ...``.
It lives in ``scorers`` (the lowest layer) so that ``tracing`` and ``worker`` can use it too.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ["header_value_problem", "scrub_secrets"]

T = TypeVar("T")
_MASK = "***"
# A literal secret (the configured API key, a URL's password, a sink token, an exporter header
# value) is masked by value only from this length on. Literals are passed only when they are
# known to be credentials, so leaking a short real password is worse than blanking a few
# letters of an error message; shorter still ("1", "on", "abc") would blank every digit or
# common syllable and leave the message unreadable, and no usable credential is that short.
_MIN_LITERAL = 4

# What a credential looks like in an error body, a header dump or a URL. Each keeps its label
# (so the message still says "Authorization: ***" or "redis://user:***@host") and masks the value.
_SECRET_PATTERNS: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    # "Authorization: Bearer abc", "authorization": "Basic abc" — the whole value, to line end
    (re.compile(r"""(\bauthorization["']?\s*[:=]\s*["']?)[^"'\r\n,}]+""", re.IGNORECASE), rf"\g<1>{_MASK}"),
    (re.compile(r"(\bbearer\s+)[A-Za-z0-9._~+/=-]{4,}", re.IGNORECASE), rf"\g<1>{_MASK}"),
    # "Basic dXNlcjpwYXNz" without its "Authorization:" label (a gateway's 401 quoting what it
    # got): base64 of user:password, which decodes to the password. Only a value shaped like
    # base64 (a digit, '+', '/', '=' or a lower-to-upper turn), so prose ("basic authentication
    # required", "Basic Authentication") is left alone.
    (
        re.compile(r"((?i:\bbasic)\s+)(?=[A-Za-z0-9+/]*(?:[0-9+/=]|[a-z][A-Z]))[A-Za-z0-9+/]{8,}={0,2}"),
        rf"\g<1>{_MASK}",
    ),
    # a labelled value: api_key=..., x-api-key: ..., "apiKey": "...", "password": "...",
    # client_secret=..., MLFLOW_TRACKING_TOKEN=... The label must be followed by ':' or '=',
    # so prose ("password reset", "invalid token", "max_tokens") is left alone. The label is matched
    # from the start of its word only (the lookbehind): tried from every position of a long
    # dashed word, the search would take quadratic time on a large error body. A quoted value
    # is masked to its closing quote (a passphrase has spaces), a bare one to a separator. A
    # URL's user named like a label ("redis://token:pw@host") was masked by _USERINFO already:
    # taking "***@host" as its value would hide the host, which says which server refused.
    (
        re.compile(
            r"""(?P<label>(?<![\w-])[\w-]*(?:api[_-]?key|access[_-]?key|secret[_-]?key|secret|password|passwd"""
            r"""|token)["']?\s*[:=]\s*)(?!\*\*\*@)(?:(?P<q>["'])[^\r\n]*?(?P=q)|["']?[^\s"'&,;}]+)""",
            re.IGNORECASE,
        ),
        lambda m: f"{m['label']}{m['q']}{_MASK}{m['q']}" if m["q"] else f"{m['label']}{_MASK}",
    ),
    # OpenAI (sk-..., sk-proj-...), Anthropic (sk-ant-...), Langfuse (sk-lf-...), Google (AIza...)
    (re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"), f"sk-{_MASK}"),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{30,}"), _MASK),
    # password-like query parameters too short or generic to be a label in prose (redis-py reads
    # ?password=, kombu/sentinel ?sentinel_password=, some proxies ?auth= or ?pwd=)
    (
        re.compile(
            r"([?&;](?:[A-Za-z_]*password|passwd|pass|pwd|secret|token|auth|api_key|apikey|access_key)=)[^&#\s;]*",
            re.IGNORECASE,
        ),
        rf"\g<1>{_MASK}",
    ),
)
# ://userinfo@ — userinfo runs to the last '@' before the host (a password may hold an
# unescaped '@', or a space: redis-py and kombu take "redis://:two words@h"), and stops at '/',
# '?', '#' or a line break, so the next URL of a list (its own "://") is safe. Prose after a
# URL without a path, up to an '@' on the same line, may be masked with it: never a password.
# Anchored on "://", not on the scheme: a URL glued to what precedes it ("111redis://:pw@h" in
# an error text) has no scheme a pattern could tell from the word, and its password must go too.
# Every '/' ends a userinfo, so each character is scanned at most once.
_USERINFO = re.compile(r"://(?P<userinfo>[^\r\n/?#]*)@")


def scrub_secrets(value: T, *secrets: str | None) -> T:
    """``value`` (a string, or dicts/lists/tuples of them, keys included) with credentials
    masked as ``***``: each literal in ``secrets`` (a credential, however the text escapes it:
    ``_written``) and anything shaped like a key, a token, an authorization header or a URL
    password, in any number of URLs.

    A URL's user name stays (it helps to see which account failed); a user-info part without
    a ``:`` is masked whole, since ``redis://secret@host`` is how some write a password alone.
    """
    patterns = [_written(s) for s in dict.fromkeys(secrets) if s and len(s) >= _MIN_LITERAL]
    return _scrub(value, patterns)  # type: ignore[no-any-return]


@functools.lru_cache(maxsize=64)
def _written(secret: str) -> re.Pattern[str]:
    """``secret`` however an answer may quote it: as is, inside JSON strings nested up to six deep
    (each character but an ASCII letter or digit maybe escaped: ``\\/``, ``\\\\/``,
    ``\\u00e9``...), percent-encoded (a URL echoed back) and as a ``bytes`` repr writes UTF-8
    (``\\xc3\\xa9``). A body the SDK could not read, or a gateway quoting the request inside its
    message, reaches the scrub so.

    Linear in the text. Each character, with the backslashes the secret has before it, is one
    group whose every form is one run of backslashes, taken whole (possessive: every backslash
    before a character is its escape's or the secret's), then a character that is not one: two
    runs side by side split a run of the text every way (exponential in the pairs: 3 s for four
    on 263 bytes). The first group begins only where a run of backslashes does (tried from each
    backslash of a run, 80 KB of them took 11 s)."""
    parts: list[str] = []
    backslashes = 0
    for ch in secret:
        if ch == "\\":
            backslashes += 1
            continue
        parts.append(_unit(ch, backslashes, first=not parts))
        backslashes = 0
    if backslashes:  # (trailing: nothing after them to split them with)
        parts.append(f"(?:{_run(backslashes, 0, first=not parts)}|{_PERCENT_BACKSLASH * backslashes})")
    return re.compile("".join(parts))


# Backslashes an escape may put before a character: 2**6 - 1, six levels of JSON in JSON.
_DEPTH = 63
_PERCENT_BACKSLASH = "%5[cC]"


def _run(backslashes: int, more: int, *, first: bool) -> str:
    """A run of the text's backslashes for ``backslashes`` of the secret's, ``more`` at least of
    an escape's own (``\\u``: 1), taken whole; the first group's only where a run begins."""
    least = backslashes + more
    if first:
        return rf"(?<!\\)\\{{{least},}}+" if least else r"(?<!\\)\\*+"
    return rf"\\{{{least},{(backslashes + 1) * (_DEPTH + 1)}}}+"


def _unit(ch: str, backslashes: int, *, first: bool) -> str:
    """The group of ``ch`` after ``backslashes`` of the secret's: as itself or escaped."""
    percent = _PERCENT_BACKSLASH * backslashes
    if ch.isascii() and ch.isalnum():
        return f"(?:{_run(backslashes, 0, first=first)}|{percent}){ch}" if backslashes else ch
    units, utf8 = ch.encode("utf-16-be"), ch.encode()
    after = rf"\\{{1,{_DEPTH + 1}}}+"
    forms = [
        f"{_run(backslashes, 0, first=first)}{re.escape(ch)}",
        _run(backslashes, 1, first=first) + after.join(f"u{_hex(units[i : i + 2])}" for i in range(0, len(units), 2)),
        _run(backslashes, 1, first=first) + after.join(f"x{_hex(bytes([b]))}" for b in utf8),
    ]
    forms.append(percent + "".join(f"%{_hex(bytes([b]))}" for b in utf8))
    if backslashes and ch in "-_.~":  # (a URL leaves these as they are)
        forms.append(percent + re.escape(ch))
    return f"(?:{'|'.join(forms)})"


def _hex(data: bytes) -> str:
    """``data`` in hex, either case."""
    return "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in data.hex())


def _scrub(value: Any, literals: list[re.Pattern[str]]) -> Any:
    if isinstance(value, str):
        for literal in literals:
            value = literal.sub(_MASK, value)
        value = _USERINFO.sub(_mask_userinfo, value)
        for pattern, replacement in _SECRET_PATTERNS:
            value = pattern.sub(replacement, value)
        return value
    if isinstance(value, Mapping):
        return {_scrub(k, literals): _scrub(v, literals) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_scrub(v, literals) for v in value)
    return value


def _mask_userinfo(match: re.Match[str]) -> str:
    userinfo = match.group("userinfo")
    if not userinfo:
        return match.group(0)
    user, colon, _ = userinfo.partition(":")
    return f"://{user}:{_MASK}@" if colon else f"://{_MASK}@"


def header_value_problem(value: str) -> str | None:
    """Why an HTTP header cannot carry ``value`` (an API key, a token), worded to follow where it
    came from ("the API key from X ..."); None when it can.

    Checked before any request, by the judges and the sinks alike: h11 and requests refuse such a
    header, and their errors (and httpcore's DEBUG log) quote it, the secret with it.
    """
    if _header_safe(value):
        return None
    if _header_safe(value.rstrip("\r\n")):
        return "ends with a line break (read from a file with its trailing newline?)"
    if value.isascii() and value.isprintable():  # a header value neither starts nor ends with a space
        return "starts or ends with a space (pasted with it?)"
    return "holds a character an HTTP header cannot carry (a control character or non-ASCII)"


def _header_safe(value: str) -> bool:
    return value.isascii() and value.isprintable() and value == value.strip(" ")
