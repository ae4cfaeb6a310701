"""The HTTP sinks' faults of configuration and of echo: Basic credentials a refusal quotes, keys
no HTTP header can carry, a URL that redirects, and score text that would drive a terminal."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from scorers import scrub_secrets
from tests._http import QuietHandler, serving
from tracing import ScoreRecord, score_id_for
from tracing.sinks import ConsoleSink, LangfuseSink, MlflowSink, PhoenixSink, Refused, ScoreSink
from tracing.sinks._http import ANSWER_ERRORS, http_client, transport_retry

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _record(n: int = 0, **fields: object) -> ScoreRecord:
    span = f"{n + 1:016x}"
    return ScoreRecord(
        score_id=score_id_for(TRACE, span, "s", "1"), trace_id=TRACE, span_id=span, scorer_id="s",
        **fields,  # type: ignore[arg-type]
    )  # fmt: skip


@contextmanager
def _server(answer: Callable[[BaseHTTPRequestHandler], None]) -> Iterator[tuple[str, list[str]]]:
    """A local HTTP server answering each POST and PATCH with ``answer``; yields its URL and the
    paths it was asked for."""
    asked: list[str] = []

    class Handler(QuietHandler):
        def _serve(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            asked.append(self.path)
            answer(self)

        do_POST = do_PATCH = _serve

    with serving(Handler) as url:
        yield url, asked


def _reply(handler: BaseHTTPRequestHandler, status: int, body: bytes, **headers: str) -> None:
    handler.send_response(status)
    for name, value in headers.items():
        handler.send_header(name.replace("_", "-"), value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _stretches(text: str, width: int = 16) -> set[str]:
    return {text[i : i + width] for i in range(len(text) - width + 1)}


@pytest.mark.parametrize("shape", ["json", "html"])
@pytest.mark.parametrize("kind", ["langfuse", "mlflow"])
def test_a_refusal_quoting_the_basic_credentials_shows_none_of_them(kind: str, shape: str) -> None:
    """A gateway's 401 quoting the Authorization it got, "Basic <base64>" or the base64 alone:
    it decodes to the Langfuse secret key, or to the password of MLflow's URL (percent-decoded
    as sent). The dead letter's detail kept it whole; now no stretch of it is left."""

    def answer(handler: BaseHTTPRequestHandler) -> None:
        sent = handler.headers.get("Authorization", "")
        if shape == "json":
            body = json.dumps({"message": f"credentials {sent} are not valid for this project"}).encode()
            _reply(handler, 401, body, Content_Type="application/json")
        else:
            body = f"<html><p>Rejected credentials: {sent.split()[-1]}</p></html>".encode()
            _reply(handler, 401, body, Content_Type="text/html")

    with _server(answer) as (url, _):
        sink: ScoreSink
        if kind == "langfuse":
            sink = LangfuseSink(url, "pk-lf-public", "sk-lf-0123456789abcdef-TOPSECRET", timeout_s=5)
            encoded = base64.b64encode(b"pk-lf-public:sk-lf-0123456789abcdef-TOPSECRET").decode()
        else:
            sink = MlflowSink(url.replace("://", "://user:Hunter2%40Hunter2Pw@"), timeout_s=5)
            encoded = base64.b64encode(b"user:Hunter2@Hunter2Pw").decode()
        try:
            (refused,) = sink.deliver([_record(score=0.5)])
        finally:
            sink.close()
    assert isinstance(refused, Refused), refused
    assert "***" in refused.detail
    assert not {s for s in _stretches(encoded) if s in refused.detail}, refused.detail
    assert "credentials" in refused.detail  # the backend's own words stay


def test_the_scrubber_masks_a_basic_credential_as_a_bearer_token() -> None:
    """ "Basic <base64>" without its "Authorization:" label is masked as "Bearer x" is; prose
    about basic authentication is not."""
    token = base64.b64encode(b"alice:wonder-land-42").decode()
    assert scrub_secrets(f"got Basic {token} from the client") == "got Basic *** from the client"
    assert scrub_secrets(f'{{"auth": "basic {token}"}}') == '{"auth": "basic ***"}'
    for prose in ("Basic authentication required", "basic auth is off", "Basic Authentication failed"):
        assert scrub_secrets(prose) == prose


_KEY = "key-0123456789"


@pytest.mark.parametrize(
    ("build", "setting", "problem"),
    [
        (lambda url: PhoenixSink(url, api_key=f"{_KEY}\n"), "TRACESCORE_PHOENIX_API_KEY", "ends with a line break"),
        (lambda url: PhoenixSink(url, api_key=f"{_KEY} "), "TRACESCORE_PHOENIX_API_KEY", "ends with a space"),
        (lambda url: MlflowSink(url, token=f"{_KEY}\r\n"), "TRACESCORE_MLFLOW_TOKEN", "ends with a line break"),
        (lambda url: MlflowSink(url, token=f"{_KEY}\u00e9"), "TRACESCORE_MLFLOW_TOKEN", "non-ASCII"),
        (lambda url: LangfuseSink(url, "pk-lf-1", f"{_KEY}\n"), "TRACESCORE_LANGFUSE_SECRET_KEY", "line break"),
        (lambda url: LangfuseSink(url, f"{_KEY}\t", "sk-lf-1"), "TRACESCORE_LANGFUSE_PUBLIC_KEY", "control"),
    ],
)
def test_a_key_no_http_header_can_carry_stops_the_sinks_construction(
    build: Callable[[str], ScoreSink], setting: str, problem: str
) -> None:
    """A key read from a secret file with its trailing newline: every request failed in h11
    before it left, as "unreachable (LocalProtocolError)", and every score was retried until
    dead-lettered (a non-ASCII one raised UnicodeEncodeError naming nothing). Now the sink is
    not built: the error names the setting and what is wrong, never the key."""
    with (
        _server(lambda handler: _reply(handler, 200, b"{}")) as (url, asked),
        pytest.raises(ValueError, match=setting) as raised,
    ):
        build(url)
    assert problem in str(raised.value)
    assert "0123456789" not in str(raised.value)
    assert asked == []


def test_a_request_h11_refuses_is_not_called_unreachable() -> None:
    """A request our HTTP stack refuses to send (a header value with a line break) never left:
    its Retry says so, instead of calling the backend unreachable."""
    with _server(lambda handler: _reply(handler, 200, b"{}")) as (url, asked):
        client, _ = http_client(url, what="Phoenix URL", setting="X", timeout_s=5, headers={"X-Probe": "a\nb"})
        try:
            with pytest.raises(ANSWER_ERRORS) as raised:
                client.post(url, content=b"{}")
        finally:
            client.close()
    assert isinstance(raised.value, httpx.LocalProtocolError)
    retry = transport_retry("Phoenix", raised.value)
    assert "unreachable" not in retry.reason
    assert retry.reason == "Phoenix: the request could not be sent as HTTP (LocalProtocolError)"
    assert asked == []


@pytest.mark.parametrize(
    ("kind", "setting"), [("mlflow", "TRACESCORE_MLFLOW_URL"), ("langfuse", "TRACESCORE_LANGFUSE_HOST")]
)
def test_a_redirecting_url_is_refused_once_for_the_batch_naming_the_setting(kind: str, setting: str) -> None:
    """An http:// URL the backend redirects to https: as Phoenix, the refusal is the URL's (it
    names the setting) and holds for every record, without a request each; it was one request
    and one "refused the score" per record, as if each score were bad."""

    def answer(handler: BaseHTTPRequestHandler) -> None:
        _reply(handler, 308, b"", Location=f"https://example.invalid{handler.path}")

    records = [_record(n, score=0.5) for n in range(5)]
    with _server(answer) as (url, asked):
        sink: ScoreSink = (
            MlflowSink(url, timeout_s=5, parallel=1)
            if kind == "mlflow"
            else LangfuseSink(url, "pk-lf-1", "sk-lf-1", timeout_s=5, parallel=1)
        )
        try:
            outcomes = sink.deliver(records)
        finally:
            sink.close()
    assert len(asked) == 1, asked
    assert len(set(outcomes)) == 1, outcomes
    refused = outcomes[0]
    assert isinstance(refused, Refused), refused
    assert "redirect (HTTP 308)" in refused.reason
    assert setting in refused.reason


def test_the_console_sink_shows_control_characters_as_replacement_characters() -> None:
    """A judge's or an agent's text with an escape sequence (a window title, a cleared screen)
    and a newline forging a second score line: printed as it was. Each control character is now
    U+FFFD: one line per score, nothing for the terminal to run."""
    forged = "boom\x1b]0;owned\x07\x1b[2J\nscore trace=FAKE scorer=s 1.000 (good)\r"
    out = io.StringIO()
    ConsoleSink(out).deliver(
        [
            _record(0, error_type="JudgeError", error_message=forged),
            _record(1, not_scorable=f"no answer\x1b[31m{chr(0x9B)}"),
            _record(2, score=0.5, label="good\nscore trace=FAKE"),
        ]
    )
    text = out.getvalue()
    lines = text.split("\n")
    assert len(lines) == 4, lines
    assert lines[-1] == ""
    assert not [c for c in text.replace("\n", "") if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0]
    assert "boom\ufffd]0;owned\ufffd\ufffd[2J\ufffdscore trace=FAKE" in lines[0]
    assert lines[2].endswith("0.500 (good\ufffdscore trace=FAKE)")
