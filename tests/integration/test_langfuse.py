"""LangfuseSink against a local server that checks Langfuse's score API (``_fake_langfuse.py``):
request shape by the public API definition, Basic auth, upsert by id, 503/429 for a while."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from tests.integration._drain import drain
from tests.integration._fake_langfuse import BODY_LIMIT, SCORES_PATH, FakeLangfuse
from tests.integration._traces import ROOT, TRACESCORE
from tracing import ScoreRecord, score_id_for
from tracing.sinks import Delivered, LangfuseSink, Refused, Retry

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPANS = ("00f067aa0ba902b7", "00f067aa0ba902b8")


@pytest.fixture
def langfuse() -> Iterator[FakeLangfuse]:
    server = FakeLangfuse().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def sink(langfuse: FakeLangfuse) -> Iterator[LangfuseSink]:
    sink = LangfuseSink(langfuse.url, langfuse.public_key, langfuse.secret_key, timeout_s=5.0)
    try:
        yield sink
    finally:
        sink.close()


def record(scorer_id: str, span_id: str = SPANS[0], **fields: object) -> ScoreRecord:
    return ScoreRecord.model_validate(
        {
            "score_id": score_id_for(TRACE, span_id, scorer_id, "1"),
            "trace_id": TRACE,
            "span_id": span_id,
            "scorer_id": scorer_id,
            "source": "live",
            **fields,
        }
    )


def one_of_each() -> list[ScoreRecord]:
    """A code score with a label, a judged score, a label-only score, not scorable, a failure."""
    return [
        record("answer-length", score=0.4, label="short", reason="80 characters"),
        record("helpfulness", SPANS[1], score=0.75, reason="mostly helpful", judge_models=["openai/gpt-4o-mini"]),
        record("tone", label="friendly", reason="warm wording"),
        record("needs-ground-truth", not_scorable="generate_score: no ground truth"),
        record(
            "always-fails", error_type="IndexError", error_message="index out of range", failed_step="generate_score"
        ),
    ]


def test_each_score_arrives_once_in_langfuses_shape(langfuse: FakeLangfuse, sink: LangfuseSink) -> None:
    """One request and one Langfuse score per record: id, trace/observation, name, dataType,
    value, comment and metadata by the mapping."""
    records = one_of_each()
    assert sink.deliver(records) == [Delivered()] * len(records)
    assert langfuse.statuses == {200: len(records)}
    assert set(langfuse.scores) == {r.score_id for r in records}

    got = {score["name"]: score for score in langfuse.scores.values()}
    for r in records:
        score = got[r.scorer_id]
        assert (score["traceId"], score["observationId"]) == (TRACE, r.span_id)
        assert score["metadata"]["score_id"] == r.score_id
        assert score["metadata"]["scorer_version"] == "1"
        assert score["metadata"]["source"] == "live"
    length = got["answer-length"]
    assert (length["dataType"], length["value"], length["comment"]) == ("NUMERIC", 0.4, "80 characters")
    assert got["answer-length"]["metadata"]["label"] == "short"
    assert (got["helpfulness"]["dataType"], got["helpfulness"]["value"]) == ("NUMERIC", 0.75)
    assert got["helpfulness"]["metadata"]["judge_models"] == "openai/gpt-4o-mini"
    assert (got["tone"]["dataType"], got["tone"]["value"], got["tone"]["comment"]) == (
        "CATEGORICAL",
        "friendly",
        "warm wording",
    )
    assert (got["needs-ground-truth"]["dataType"], got["needs-ground-truth"]["value"]) == (
        "CATEGORICAL",
        "not scorable",
    )
    assert got["needs-ground-truth"]["comment"] == "generate_score: no ground truth"
    failed = got["always-fails"]
    assert (failed["dataType"], failed["value"]) == ("CATEGORICAL", "error")
    assert failed["comment"] == "IndexError in generate_score: index out of range"
    assert failed["metadata"]["error_type"] == "IndexError"


@pytest.mark.parametrize(
    ("environment", "filed"),
    [
        ("production", "production"),
        ("Prod-EU", "prod-eu"),  # Langfuse lowercases
        ("langfuse-staging", "staging"),  # and takes its reserved prefix off
        ("qa env", "default"),  # a space: not an environment name
        ("x" * 41, "x" * 40),
        ("", "default"),
        (None, "default"),
    ],
)
def test_a_score_goes_to_its_traces_environment(
    langfuse: FakeLangfuse, sink: LangfuseSink, environment: str | None, filed: str
) -> None:
    """Langfuse files a trace under its spans' environment and hides the rest from a view
    filtered on it: each score goes under its span's, named as Langfuse names it."""
    scored = record("answer-length", score=0.4, environment=environment)
    assert sink.deliver([scored]) == [Delivered()]
    assert langfuse.scores[scored.score_id]["environment"] == filed


def test_a_resend_upserts_by_id(langfuse: FakeLangfuse, sink: LangfuseSink) -> None:
    """Re-sending every score (and a changed one, twice) keeps one score per id; the change shows."""
    records = one_of_each()
    drain(sink, records)
    first = {k: dict(v) for k, v in langfuse.scores.items()}

    assert sink.deliver(records) == [Delivered()] * len(records)
    changed = records[0].model_copy(update={"score": 0.9, "reason": "re-scored"})
    assert sink.deliver([changed, changed]) == [Delivered(), Delivered()]

    assert langfuse.scores.keys() == first.keys()
    again = langfuse.scores[changed.score_id]
    assert (again["value"], again["comment"]) == (0.9, "re-scored")
    assert again["createdAt"] == first[changed.score_id]["createdAt"]
    assert langfuse.statuses == {200: 2 * len(records) + 2}


def test_a_record_replacing_another_leaves_nothing_of_it_in_langfuse(
    langfuse: FakeLangfuse, sink: LangfuseSink
) -> None:
    """Langfuse merges a score sent again into the one it holds: a field or metadata key left out
    kept the old value. A timeout later scored as a number with no reason kept the error's
    comment, error type and failed step beside its value, and a shorter model list the rest."""
    failed = record(
        "helpfulness",
        error_type="timeout",
        error_message="did not finish within 30 s",
        failed_step="generate_score",
        judge_models=["anthropic/claude-haiku-4-5", "openai/gpt-4o-mini"],
        retryable=True,
    )
    assert sink.deliver([failed]) == [Delivered()]
    scored = record("helpfulness", score=0.8, judge_models=["openai/gpt-4o-mini"])
    assert scored.score_id == failed.score_id
    assert sink.deliver([scored]) == [Delivered()]

    (score,) = langfuse.scores.values()
    assert (score["dataType"], score["value"], score["comment"]) == ("NUMERIC", 0.8, None)
    metadata = score["metadata"]
    assert (metadata["error_type"], metadata["failed_step"], metadata["label"]) == ("", "", "")
    assert metadata["judge_models"] == "openai/gpt-4o-mini"


def test_a_suspended_project_is_named_not_taken_for_bad_keys(langfuse: FakeLangfuse) -> None:
    """Langfuse Cloud answers 403 "Ingestion suspended" past a project's usage threshold: the
    refusal says so and how to send the scores again (it said to check the keys), after one
    request for the batch."""
    langfuse.suspended = True
    sink = LangfuseSink(langfuse.url, langfuse.public_key, langfuse.secret_key, parallel=1)
    try:
        outcomes = sink.deliver(one_of_each())
    finally:
        sink.close()
    assert langfuse.statuses == {403: 1}
    assert len(outcomes) == 5
    for outcome in outcomes:
        assert isinstance(outcome, Refused), outcome
        assert "suspended ingestion for this project (HTTP 403" in outcome.reason
        assert "tracescore sinks retry langfuse --all" in outcome.reason
        assert "TRACESCORE_LANGFUSE_SECRET_KEY" not in outcome.reason


def test_wrong_keys_are_refused_naming_401_without_echoing_them(langfuse: FakeLangfuse) -> None:
    """Wrong keys: every record Refused, naming HTTP 401 and the settings to check, after one
    request (the keys are wrong for all of them); neither key appears; nothing is stored."""
    public, secret = "pk-lf-wrong-public-7f3a", "sk-lf-wrong-secret-9c1e"
    sink = LangfuseSink(langfuse.url, public, secret, parallel=1)
    try:
        outcomes = sink.deliver(one_of_each())
    finally:
        sink.close()
    assert langfuse.statuses == {401: 1}
    assert len(outcomes) == 5
    assert langfuse.scores == {}
    for outcome in outcomes:
        assert isinstance(outcome, Refused), outcome
        assert "HTTP 401" in outcome.reason
        assert "TRACESCORE_LANGFUSE_SECRET_KEY" in outcome.reason
        assert outcome.detail.startswith("Invalid credentials")
        assert secret not in repr(outcome)
        assert public not in repr(outcome)


def test_503_then_recovery_is_retry_then_delivered_once(langfuse: FakeLangfuse, sink: LangfuseSink) -> None:
    """Langfuse answering 503 for a while: those records Retry (named), the others Delivered, and
    the records not sent yet when a 503 came back wait unsent (four requests at a time: the
    fifth of each round); afterwards every score is stored exactly once."""
    records = one_of_each()
    langfuse.fail_next(7, 503)
    rounds = drain(sink, records, interval_s=0.05)
    busy = Retry("Langfuse answered HTTP 503")
    assert rounds[0] == [busy] * len(records)  # four 503s, the fifth unsent
    assert sorted(map(repr, rounds[1])) == sorted(map(repr, [busy] * 4 + [Delivered()]))  # three more
    assert rounds[2] == [Delivered()] * 4
    assert set(langfuse.scores) == {r.score_id for r in records}
    assert langfuse.statuses == {503: 7, 200: len(records)}


def test_429_passes_retry_after_on(langfuse: FakeLangfuse, sink: LangfuseSink) -> None:
    """429 with Retry-After: Retry with that hint for the drainer, for the rest of the batch too,
    which is not sent into the window (the README: a 429 as a 503; four requests at a time)."""
    langfuse.fail_next(1, 429, retry_after="7")
    assert sink.deliver(one_of_each()[:1]) == [Retry("Langfuse answered HTTP 429", after_s=7.0)]
    langfuse.fail_next(4, 429, retry_after="7")
    records = one_of_each()
    assert sink.deliver(records) == [Retry("Langfuse answered HTTP 429", after_s=7.0)] * len(records)
    assert langfuse.statuses == {429: 5}  # the fifth record of the batch was held back, unsent
    assert langfuse.scores == {}


def test_unreachable_langfuse_costs_one_attempt_per_batch(langfuse: FakeLangfuse) -> None:
    """Nothing listening: every record Retry (named), after a single connection attempt."""
    url = langfuse.url
    langfuse.stop()
    sink = LangfuseSink(url, "pk", "sk", timeout_s=2.0)
    try:
        outcomes = sink.deliver(one_of_each())
    finally:
        sink.close()
    assert outcomes == [Retry("Langfuse unreachable (ConnectError)")] * 5


def test_records_langfuse_cannot_match_are_refused_without_a_request(
    langfuse: FakeLangfuse, sink: LangfuseSink
) -> None:
    """Non-hex trace or span ids, neither value nor label, an infinite score: Refused, named, not sent."""
    bad = [
        record("a").model_copy(update={"trace_id": "nope", "score": 1.0}),
        record("b").model_copy(update={"span_id": "xyz", "score": 1.0}),
        record("c"),
        record("d", score=float("inf")),
    ]
    outcomes = sink.deliver(bad)
    assert all(isinstance(o, Refused) for o in outcomes), outcomes
    assert "trace id is not 32 hex digits" in str(outcomes[0])
    assert "span id is not 16 hex digits" in str(outcomes[1])
    assert "neither a value nor a label" in str(outcomes[2])
    assert "not a finite number" in str(outcomes[3])
    assert langfuse.requests == 0


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"traceId": TRACE, "value": 1}, "name: required"),
        ({"name": "x", "value": 1}, "traceId: one of"),
        ({"name": "x", "traceId": TRACE, "value": "high"}, "NUMERIC score needs a finite number"),
        ({"name": "x", "traceId": TRACE, "value": 0.5, "dataType": "CATEGORICAL"}, "CATEGORICAL score needs a string"),
        ({"name": "x", "traceId": TRACE, "value": 2, "dataType": "BOOLEAN"}, "BOOLEAN score needs 0 or 1"),
        ({"name": "x", "traceId": TRACE, "value": 1, "observation": "y"}, "observation: not a CreateScoreRequest"),
        ({"name": "x", "observationId": SPANS[0], "sessionId": "s", "value": 1}, "observationId: only with traceId"),
        ({"name": "x", "traceId": TRACE, "value": 1, "metadata": "m"}, "metadata: expected an object"),
    ],
)
def test_the_fake_refuses_what_langfuse_refuses(langfuse: FakeLangfuse, body: dict[str, object], problem: str) -> None:
    """The checker itself: bodies that break the definition get 400 naming the field (so the
    tests above would catch a sink sending them)."""
    auth = base64.b64encode(f"{langfuse.public_key}:{langfuse.secret_key}".encode()).decode()
    response = httpx.post(langfuse.url + SCORES_PATH, json=body, headers={"Authorization": f"Basic {auth}"})
    assert response.status_code == 400
    assert any(problem in p for p in response.json()["error"]), response.json()
    assert langfuse.scores == {}


def test_a_400_is_refused_with_langfuses_message(langfuse: FakeLangfuse, sink: LangfuseSink) -> None:
    """A score Langfuse's validation rejects (no name) is Refused with Langfuse's message and the
    field it names, without the score's text; the other records are still Delivered."""
    secret_reason = "the customer's order number 4711"
    nameless = record("", score=0.5, reason=secret_reason)
    outcomes = sink.deliver([nameless, *one_of_each()[:1]])
    assert outcomes[1] == Delivered()
    refused = outcomes[0]
    assert isinstance(refused, Refused), refused
    assert refused.reason == "Langfuse refused the score (HTTP 400)"
    assert refused.detail == "Invalid request data: name: required, a non-empty string"
    assert secret_reason not in repr(refused)
    assert langfuse.statuses == {400: 1, 200: 1}


# 6 characters, 16 bytes in a JSON body: escapes (a newline, a control character) and UTF-8.
_LONG_UNIT = "a é\n\x01😀"
_LONG = _LONG_UNIT * 100_000  # 1.6 MB as JSON
_CUT_MARKER = re.compile(r" … \[([\d,]+) more characters cut by tracescore: Langfuse takes a score of at most 1 MiB\]$")


def test_the_fake_answers_a_body_over_1_mib_413_as_nextjs_does(langfuse: FakeLangfuse) -> None:
    """The checker itself: Langfuse's score route keeps Next.js's default body size (1 MiB), and
    Next.js answers a larger body 413 before Langfuse sees it (credentials unchecked)."""
    body = json.dumps({"name": "x", "traceId": TRACE, "value": 1, "comment": ""}).encode()
    over = body.replace(b'"comment": ""', b'"comment": "' + b"x" * (BODY_LIMIT - len(body) + 1) + b'"')
    assert len(over) == BODY_LIMIT + 1
    response = httpx.post(langfuse.url + SCORES_PATH, content=over, headers={"Content-Type": "application/json"})
    assert (response.status_code, response.text) == (413, "Body exceeded 1mb limit")
    assert langfuse.scores == {}


@pytest.mark.parametrize(
    ("fields", "comment"),
    [
        ({"score": 0.5, "reason": _LONG}, _LONG),
        ({"not_scorable": _LONG}, _LONG),
        (
            {"error_type": "IndexError", "error_message": _LONG, "failed_step": "analyze"},
            f"IndexError in analyze: {_LONG}",
        ),
    ],
    ids=["reason", "not-scorable", "error"],
)
def test_a_comment_over_langfuses_body_limit_is_cut_with_a_count_and_delivered(
    langfuse: FakeLangfuse, sink: LangfuseSink, fields: dict[str, object], comment: str
) -> None:
    """A judge's reason (or an error, or not scorable's reason) of 1.6 MB as JSON: Langfuse
    (Next.js) answers such a body 413, and the score was refused, lost to Langfuse. Now its
    comment keeps as much of the start as fits and ends saying how many characters were cut;
    the cut is logged with its counts, never its text."""
    long = record("verbose", **fields)
    with capture_logs() as logs:
        assert sink.deliver([long]) == [Delivered()]
    assert langfuse.statuses == {200: 1}
    assert BODY_LIMIT * 0.9 < langfuse.largest_body <= BODY_LIMIT  # most of what Langfuse takes
    stored = langfuse.scores[long.score_id]["comment"]
    marker = _CUT_MARKER.search(stored)
    assert marker is not None, stored[-200:]
    kept = stored[: marker.start()]
    assert comment.startswith(kept)
    assert len(kept) + int(marker[1].replace(",", "")) == len(comment)
    [cut] = [entry for entry in logs if entry["event"] == "langfuse_comment_cut"]
    assert cut["score_id"] == long.score_id
    assert (cut["kept_chars"], cut["cut_chars"]) == (len(kept), len(comment) - len(kept))
    assert _LONG_UNIT not in repr(cut)


def test_a_comment_that_fits_is_sent_whole(langfuse: FakeLangfuse, sink: LangfuseSink) -> None:
    """Just under the limit (0.9 MiB of reason): sent as it is, nothing cut or logged."""
    reason = "x" * int(BODY_LIMIT * 0.9)
    fits = record("verbose", score=0.5, reason=reason)
    with capture_logs() as logs:
        assert sink.deliver([fits]) == [Delivered()]
    assert langfuse.scores[fits.score_id]["comment"] == reason
    assert [entry for entry in logs if entry["event"] == "langfuse_comment_cut"] == []


def test_a_score_over_the_limit_without_its_comment_is_refused_unsent(
    langfuse: FakeLangfuse, sink: LangfuseSink
) -> None:
    """A label of 2 MB (the value of a CATEGORICAL score, and in metadata): no comment to cut
    makes it fit, so it is refused here, saying why, without a request Langfuse would answer 413
    on every retry; the rest of the batch is delivered."""
    huge = record("labeller", label="good " * 400_000, reason="short")
    outcomes = sink.deliver([huge, *one_of_each()[:1]])
    assert outcomes[1] == Delivered()
    refused = outcomes[0]
    assert isinstance(refused, Refused), refused
    assert "even without its comment: its name or label is too long" in refused.reason
    assert "good good" not in repr(refused)
    assert langfuse.statuses == {200: 1}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("cloud.langfuse.com", "pk", "sk-lf-secret-1234"), "Langfuse host must be http(s)://"),
        (("https://h", "", "sk-lf-secret-1234"), "TRACESCORE_LANGFUSE_PUBLIC_KEY"),
        (("https://h", "pk", ""), "TRACESCORE_LANGFUSE_SECRET_KEY"),
    ],
)
def test_bad_arguments_fail_at_once_without_the_secret(args: tuple[str, str, str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as raised:
        LangfuseSink(*args)
    assert "sk-lf-secret-1234" not in str(raised.value)


def backfill(langfuse: FakeLangfuse, secret_key: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The README's recipe in process: ``tracescore backfill examples/traces --sink langfuse``."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TRACESCORE_BROKER_URL": "",
        "TRACESCORE_LANGFUSE_PUBLIC_KEY": langfuse.public_key,
        "TRACESCORE_LANGFUSE_SECRET_KEY": secret_key,
    }
    return subprocess.run(
        [TRACESCORE, "backfill", str(ROOT / "examples" / "traces"), "--scorers", "examples.scorers",
         "--sink", "langfuse", "--langfuse-host", langfuse.url, "--worst", "0", "--out", str(tmp_path / "out.jsonl")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def test_backfill_with_sink_langfuse_delivers_every_score_once(langfuse: FakeLangfuse, tmp_path: Path) -> None:
    """``tracescore backfill --sink langfuse``: exit 0, the summary counts every score delivered,
    and Langfuse holds exactly the records the command wrote, one score each."""
    result = backfill(langfuse, langfuse.secret_key, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    written = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines() if line.strip()]
    assert written
    assert set(langfuse.scores) == {r["score_id"] for r in written}
    assert langfuse.statuses == {200: len(written)}
    # The example traces ran in "demo" (their resource's deployment.environment.name).
    assert {r["environment"] for r in written} == {"demo"}
    assert {score["environment"] for score in langfuse.scores.values()} == {"demo"}
    assert f"sink langfuse     delivered {len(written):,}, failed 0, pending 0" in result.stdout + result.stderr


def test_backfill_with_wrong_langfuse_keys_exits_4_naming_the_401(langfuse: FakeLangfuse, tmp_path: Path) -> None:
    """Wrong keys: exit 4, the summary names the 401 and the settings; the key appears nowhere;
    Langfuse got one request per batch, not one per score."""
    wrong = "sk-lf-wrong-key-5d2e"
    result = backfill(langfuse, wrong, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 4, output
    assert "Langfuse refused the credentials (HTTP 401)" in output
    assert wrong not in output
    assert langfuse.scores == {}
    written = (tmp_path / "out.jsonl").read_text().count("\n")
    assert 0 < langfuse.statuses[401] < written


# Every code point, lone surrogates too (hypothesis leaves them out unless asked); some often.
_chars = st.characters(exclude_categories=[]) | st.sampled_from(["\ud800", "\udfff", "\x00", "é", "😀"])
_texts = st.none() | st.text(alphabet=_chars, max_size=60)
_records = st.builds(
    record,
    # Ids are names in code and go into the score id's hash: no lone surrogates there.
    scorer_id=st.text(min_size=1, max_size=30),
    span_id=st.sampled_from(SPANS),
    scorer_name=_texts,
    score=st.none() | st.floats(allow_nan=True, allow_infinity=True),
    label=_texts,
    reason=_texts,
    not_scorable=_texts,
    error_type=st.none() | st.from_regex(r"[A-Z][A-Za-z]{0,20}Error", fullmatch=True),
    error_message=_texts,
    judge_models=st.lists(st.text(max_size=20), max_size=2),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(_records, min_size=1, max_size=6, unique_by=lambda r: r.score_id))  # an outbox batch
def test_any_record_is_delivered_or_refused_by_the_sink_never_by_langfuse(
    langfuse: FakeLangfuse, sink: LangfuseSink, records: list[ScoreRecord]
) -> None:
    """Whatever a record holds (any text, lone surrogates included; NaN/inf; any mix of score,
    label, error, not scorable): the sink sends only bodies the definition accepts (no 400),
    and refuses the rest itself, named; deliver never raises."""
    before = langfuse.statuses[400]
    outcomes = sink.deliver(records)
    assert len(outcomes) == len(records)
    assert langfuse.statuses[400] == before, [o for o in outcomes if isinstance(o, Refused)]
    for r, outcome in zip(records, outcomes, strict=True):
        if isinstance(outcome, Refused):
            assert outcome.reason in (
                "score is not a finite number (JSON cannot carry it)",
                "score has neither a value nor a label (nothing for Langfuse to show)",
            ), outcome
        else:
            assert outcome == Delivered()
            stored = langfuse.scores[r.score_id]
            assert stored["observationId"] == r.span_id
            # A lone surrogate (not UTF-8) arrives as U+FFFD; everything else as it was.
            assert stored["name"] == re.sub("[\ud800-\udfff]", "\ufffd", r.scorer_name or r.scorer_id)
