"""`tracescore backfill` without a broker: --dry-run's cost estimate, --max-cost held by the
in-memory ledger, the summary's spend per scorer and model — judge calls through the real
OpenAI SDK to tests/fakellm, priced by a TRACESCORE_PRICES override."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from scorers.judge import JudgeHooks, get_judge_hooks, set_judge_hooks
from tests.backfill._synth import write_otlp_files
from tests.fakellm import FakeLLMServer, Reply
from tests.worker._budget import PRICES, SCORERS
from worker._budget import CostEstimate, price_table
from worker._registry import load_registry
from worker.cli import cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "traces"


@pytest.fixture(autouse=True)
def _restore_hooks() -> Iterator[None]:
    """The embedded backfill installs its own judge guard in this process: put the hooks back."""
    previous = get_judge_hooks()
    yield
    set_judge_hooks(previous if isinstance(previous, JudgeHooks) else JudgeHooks())


def _run(*args: str, as_json: bool = True, **env: str) -> Result:
    return CliRunner().invoke(
        cli,
        [
            "backfill",
            str(EXAMPLES),
            "--scorers",
            SCORERS,
            "--scorer",
            "costly",
            *(["--json"] if as_json else []),
            *args,
        ],
        env={"TRACESCORE_BROKER_URL": "", "TRACESCORE_PRICES": PRICES, **env},
    )


def _summary(result: Result) -> dict[str, Any]:
    assert result.exit_code == 0, result.output
    parsed: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return parsed


def test_dry_run_estimates_tokens_and_cost_without_calling_the_judge(fake_llm: FakeLLMServer) -> None:
    """--dry-run prints the estimate (300 runs × 1 prompt step) and pays nothing; the real run's
    spend is within the documented error (an order of magnitude) of it."""
    estimate = _summary(_run("--dry-run"))["estimate"]
    assert fake_llm.count() == 0
    assert estimate["judge_calls"] == 300
    assert estimate["by_scorer"]["costly"]["runs"] == 300
    assert estimate["input_tokens"] > 300 * 50
    assert estimate["cost_usd"] == pytest.approx(
        (estimate["input_tokens"] * 100 + estimate["output_tokens"] * 200) / 1e6
    )
    text = _run("--dry-run", as_json=False).output
    assert f"estimated judge cost: ~{estimate['cost_usd']:.4f} USD for 300 judge calls" in text

    spent = _summary(_run())["spend"]
    assert fake_llm.count() == 300
    assert spent["judge_calls"] == 300
    assert estimate["cost_usd"] / 10 < spent["total_usd"] < estimate["cost_usd"] * 10


def test_max_cost_stops_paying_and_the_summary_shows_spend(fake_llm: FakeLLMServer, tmp_path: Path) -> None:
    """--max-cost 0.05 in process: runs past it are budget_exhausted records (counted in the
    summary), the judge is not called for them, and the spend shown is the records' sum."""
    out = tmp_path / "scores.jsonl"
    result = _run("--max-cost", "0.05", "--out", str(out), "--batch-size", "1")
    summary = _summary(result)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 300
    exhausted = [r for r in records if r["error_type"] == "budget_exhausted"]
    ok = [r for r in records if r["error_type"] is None]
    assert ok
    assert exhausted
    assert len(ok) + len(exhausted) == 300
    assert all("--max-cost" in r["error_message"] for r in exhausted)
    assert fake_llm.count() == len(ok)
    assert summary["failed_by_reason"]["budget_exhausted"] == len(exhausted)
    total = sum(r["cost_usd"] for r in records)
    assert summary["spend"]["total_usd"] == pytest.approx(total)
    assert summary["spend"]["by_scorer"]["costly"] == pytest.approx(total)
    assert summary["spend"]["by_model"]["openai/fake-judge"] == pytest.approx(total)
    assert total >= 0.05
    assert "judge spend" in result.stderr
    assert "model  openai/fake-judge:" in result.stderr
    # Counted in the summary, not a warning line per refused call (one line each, before).
    assert "judge.refused" not in result.stderr


def test_a_retry_for_a_neighbour_leaves_a_budget_refusal_recorded_once(fake_llm: FakeLLMServer, tmp_path: Path) -> None:
    """Embedded mode's twin of tests/worker/test_budget_retry.py: one run, `costly` refused by a
    spent budget (a retryable record, counted) and `plain` whose judge answers 503 once (left for
    the batch's retry). The retry scored `costly` again: refused again, its second record went to
    the summary's row (2 runs, 2 failed for one run) and to --out (two lines for one score). Now
    the retry leaves the refusal as recorded: one record per (run, scorer), counted once."""
    traces = tmp_path / "traces"
    write_otlp_files(traces, 1, files=1, compress=False)
    out = tmp_path / "scores.jsonl"
    fake_llm.rule(Reply.error(503, "overloaded"), user_contains="PLAIN", times=1)
    args = ["backfill", str(traces), "--scorers", SCORERS, "--scorer", "costly", "--scorer", "plain"]
    result = CliRunner().invoke(
        cli,
        [*args, "--json", "--out", str(out)],
        env={
            "TRACESCORE_BROKER_URL": "",
            "TRACESCORE_PRICES": PRICES,
            "TRACESCORE_BUDGETS": json.dumps({"scorers": {"costly": 0}}),
        },
    )
    summary = _summary(result)
    # The neighbour was retried (the path under test), the refused run never paid.
    assert ["PLAIN" in r.user_text for r in fake_llm.requests] == [True, True]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["scorer_id"], r["error_type"]) for r in records) == [
        ("costly", "budget_exhausted"),
        ("plain", None),
    ]
    assert (summary["scored"], summary["failed"], summary["failed_by_reason"]) == (1, 1, {"budget_exhausted": 1})
    costly, plain = summary["by_scorer"]["costly"], summary["by_scorer"]["plain"]
    assert (costly["runs"], costly["failed"], costly["failed_by_reason"]) == (1, 1, {"budget_exhausted": 1})
    assert "daily budget of scorer costly is spent" in costly["failure_examples"]["budget_exhausted"]["error"]
    assert (plain["runs"], plain["scored"], plain["failed"]) == (1, 1, 0)


def test_a_run_at_its_judge_call_cap_is_recorded_once_across_the_batch_retries(
    fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    """Embedded mode retries a batch for its transient failures, as a worker its message. One
    run: `retrying`'s judge always answers 429 (four calls a try); `plain`'s answers 503 twice.
    The second try reaches the run's cap of 7 failed calls (4 + the retry budget of 3) and records
    `retrying` as a retryable failure naming the last judge error; the third, for `plain`, used
    to score `retrying` again (refused at once by the cap: a second record, in the summary and
    --out). Now: 7 calls, one record per (run, scorer), the failure counted once with its reason."""
    traces = tmp_path / "traces"
    write_otlp_files(traces, 1, files=1, compress=False)
    out = tmp_path / "scores.jsonl"
    fake_llm.rule(Reply.rate_limited(retry_after="0"), user_contains="RETRY")
    fake_llm.rule(Reply.error(503, "overloaded"), user_contains="PLAIN", times=2)
    args = ["backfill", str(traces), "--scorers", SCORERS, "--scorer", "retrying", "--scorer", "plain"]
    result = CliRunner().invoke(
        cli,
        [*args, "--json", "--out", str(out)],
        env={"TRACESCORE_BROKER_URL": "", "TRACESCORE_PRICES": PRICES, "TRACESCORE_BUDGETS": ""},
    )
    summary = _summary(result)
    asked = [r.user_text.split()[0] for r in fake_llm.requests]
    assert (asked.count("RETRY"), asked.count("PLAIN")) == (7, 3)  # three tries of the batch
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["scorer_id"], r["error_type"], r["retryable"]) for r in records) == [
        ("plain", None, False),
        ("retrying", "JudgeRateLimitError", True),
    ]
    refused = next(r for r in records if r["scorer_id"] == "retrying")
    assert "7 judge call(s) of this run failed" in refused["error_message"]
    assert (summary["scored"], summary["failed"], summary["failed_by_reason"]) == (1, 1, {"JudgeRateLimitError": 1})
    retrying = summary["by_scorer"]["retrying"]
    assert (retrying["runs"], retrying["failed"], retrying["failed_by_reason"]) == (1, 1, {"JudgeRateLimitError": 1})
    assert summary["by_scorer"]["plain"]["runs"] == 1


def test_a_batch_retry_resumes_after_the_judge_steps_answered(fake_llm: FakeLLMServer, tmp_path: Path) -> None:
    """A two-step judge scorer whose second step answers 503 once: embedded mode kept no step
    checkpoints, so the batch's retry asked the first step's judge again (paid twice), and the
    summary's spend, summed from the record, left that call out (2 calls shown, 3 paid). It
    resumes after the answered step now, as a worker's retry does: 2 answered calls, both paid
    for, and the 503 between them a third call shown (the spend is the ledger's, every call)."""
    traces = tmp_path / "traces"
    write_otlp_files(traces, 1, files=1, compress=False)
    out = tmp_path / "scores.jsonl"
    fake_llm.rule(Reply.error(503, "overloaded"), user_contains="GRADE", times=1)
    result = CliRunner().invoke(
        cli,
        ["backfill", str(traces), "--scorers", SCORERS, "--scorer", "two-steps", "--json", "--out", str(out)],
        env={"TRACESCORE_BROKER_URL": "", "TRACESCORE_PRICES": PRICES, "TRACESCORE_BUDGETS": ""},
    )
    summary = _summary(result)
    assert [r.user_text.split()[0] for r in fake_llm.requests] == ["CLAIMS", "GRADE", "GRADE"]
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (record["error_type"], record["score"], record["judge_calls"]) == (None, 0.5, 2)
    assert summary["spend"]["judge_calls"] == len(fake_llm.requests) == 3
    assert summary["spend"]["total_usd"] == pytest.approx(record["cost_usd"])


def _one_run(fake_llm: FakeLLMServer, tmp_path: Path, scorer: str, **env: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """An embedded backfill of one run with ``scorer``: its summary and its one --out record
    (exit code 1 when that record is a failure: every score failed)."""
    traces = tmp_path / "traces"
    write_otlp_files(traces, 1, files=1, compress=False)
    out = tmp_path / "scores.jsonl"
    result = CliRunner().invoke(
        cli,
        ["backfill", str(traces), "--scorers", SCORERS, "--scorer", scorer, "--json", "--out", str(out)],
        env={"TRACESCORE_BROKER_URL": "", "TRACESCORE_PRICES": PRICES, "TRACESCORE_BUDGETS": "", **env},
    )
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert result.exit_code == (1 if record["error_type"] else 0), result.output
    summary: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return summary, record


def test_an_embedded_backfill_retries_a_batch_as_the_retry_budget_says(fake_llm: FakeLLMServer, tmp_path: Path) -> None:
    """Issue 11, options mean the same everywhere: a worker tries a message 1 + RETRY_BUDGET
    times, RETRY_BACKOFF_SECONDS apart (doubling). The embedded backfill ignored both: 3 tries,
    1 s doubling, whatever they said. With RETRY_BUDGET=0 a judge's one 503 is a retryable
    failure at once (it was retried twice); with 4, four 503s are outlasted (it gave up after 3)."""
    fake_llm.rule(Reply.error(503, "overloaded"), user_contains="PLAIN", times=1)
    summary, record = _one_run(fake_llm, tmp_path, "plain", TRACESCORE_RETRY_BUDGET="0")
    assert len(fake_llm.requests) == 1
    assert (record["error_type"], record["retryable"]) == ("JudgeServerError", True)
    assert summary["failed_by_reason"] == {"JudgeServerError": 1}

    fake_llm.reset()
    fake_llm.rule(Reply.error(503, "overloaded"), user_contains="PLAIN", times=4)
    summary, record = _one_run(
        fake_llm, tmp_path / "more", "plain", TRACESCORE_RETRY_BUDGET="4", TRACESCORE_RETRY_BACKOFF_SECONDS="0"
    )
    assert len(fake_llm.requests) == 5
    assert (record["error_type"], record["score"]) == (None, 0.5)
    assert summary["scored"] == 1


def test_an_embedded_backfill_waits_the_retry_backoff(fake_llm: FakeLLMServer, tmp_path: Path) -> None:
    """RETRY_BACKOFF_SECONDS=1.5: the batch's retry comes no sooner (it came after 1 s, the
    embedded scorer's own backoff)."""
    fake_llm.rule(Reply.error(503, "overloaded"), user_contains="PLAIN", times=1)
    _, record = _one_run(
        fake_llm, tmp_path, "plain", TRACESCORE_RETRY_BUDGET="1", TRACESCORE_RETRY_BACKOFF_SECONDS="1.5"
    )
    first, second = (r.received_at for r in fake_llm.requests)
    assert second - first >= 1.5
    assert record["score"] == 0.5


def test_an_embedded_backfill_holds_the_judge_call_cap(fake_llm: FakeLLMServer, tmp_path: Path) -> None:
    """MAX_JUDGE_ATTEMPTS_PER_RUN=2 with a judge that always answers 429: two calls, then the
    run's retryable record saying so (the embedded scorer used the default cap: 7 calls)."""
    fake_llm.rule(Reply.rate_limited(retry_after="0"), user_contains="RETRY")
    summary, record = _one_run(
        fake_llm, tmp_path, "retrying", TRACESCORE_MAX_JUDGE_ATTEMPTS_PER_RUN="2", TRACESCORE_RETRY_BACKOFF_SECONDS="0"
    )
    assert len(fake_llm.requests) == 2
    assert (record["error_type"], record["retryable"]) == ("JudgeRateLimitError", True)
    assert "2 judge call(s) of this run failed" in record["error_message"]
    assert summary["failed_by_reason"] == {"JudgeRateLimitError": 1}


def test_unpriced_model_is_shown_unpriced_not_free(fake_llm: FakeLLMServer) -> None:
    """Without a price for the judge model, records carry cost None and the summary says so:
    the ledger's calls to it (an embedded backfill's spend is its ledger's, call by call)."""
    result = _run("--sample", "0.1", TRACESCORE_PRICES="")
    spend = _summary(result)["spend"]
    assert spend["total_usd"] == 0
    assert spend["unpriced_calls"]["openai/fake-judge"] == spend["judge_calls"] == fake_llm.count() > 0
    assert f"model  openai/fake-judge: unpriced ({fake_llm.count():,} calls;" in result.stderr


def test_a_budget_is_not_passed_by_a_model_without_a_price(fake_llm: FakeLLMServer, tmp_path: Path) -> None:
    """An unpriced judge model's calls added nothing to the ledger, so --max-cost and the daily
    budgets let every one of them through (900 calls against a 0.0001 USD cap). Once the model is
    seen answering with usage it cannot price, a budget that applies refuses its calls as
    `unpriced_model`, naming the model and TRACESCORE_PRICES (one run at a time here: the first
    call is made, the rest refused). A model that reports no usage costs 0 and is never refused."""
    out = tmp_path / "scores.jsonl"
    result = _run("--sample", "0.1", "--max-cost", "5", "--batch-size", "1", "--out", str(out), TRACESCORE_PRICES="")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    refused = [r for r in records if r["error_type"] == "unpriced_model"]
    assert len(records) > 2
    assert fake_llm.count() == 1
    assert len(refused) == len(records) - 1
    assert "openai/fake-judge has no price" in refused[0]["error_message"]
    assert "TRACESCORE_PRICES" in refused[0]["error_message"]
    assert "judge_model_unpriced" in result.stderr
    budgets = _run("--sample", "0.1", "--batch-size", "1", TRACESCORE_PRICES="", TRACESCORE_BUDGETS='{"total": 100}')
    assert budgets.exit_code == 0, budgets.output  # one scored, the others refused
    assert fake_llm.count() == 2


def test_estimate_prices_by_the_table_and_counts_unpriced_calls() -> None:
    """The estimator's arithmetic: characters / 4 per step, answer tokens, price table or unpriced."""
    registry = load_registry(SCORERS)

    class Run:
        input = "x" * 400
        output = "y" * 400

    table = {**price_table()}
    estimate = CostEstimate({"costly": registry["costly"]}, table)
    estimate.add(Run())
    data = estimate.as_json()
    assert data["judge_calls"] == 1
    assert data["unpriced_calls"] == 1  # fake-judge has no default price
    assert data["cost_usd"] == 0
    assert data["input_tokens"] > 200


def test_a_run_whose_content_cannot_be_measured_is_left_out_of_the_estimate_and_counted() -> None:
    """Content no encoder writes (here a list holding itself) raised out of the dry run's
    estimate and ended the command; that run is left out now, counted and said."""
    registry = load_registry(SCORERS)
    looped: list[object] = []
    looped.append(looped)

    class Odd:
        input = looped
        output = "y"

    class Plain:
        input = "x" * 400
        output = "y" * 400

    estimate = CostEstimate({"costly": registry["costly"]}, price_table())
    estimate.add(Odd())
    estimate.add(Plain())
    assert (estimate.as_json()["judge_calls"], estimate.as_json()["runs_not_estimated"]) == (1, 1)
    assert "1 run(s) left out: their content could not be measured" in "\n".join(estimate.lines())


def test_score_holds_the_budgets_too(fake_llm: FakeLLMServer, tmp_path: Path) -> None:
    """`tracescore score` ignored TRACESCORE_BUDGETS: a spent total budget still paid for every
    call (cost audit). It holds them as the embedded backfill does: every run refused, unpaid."""
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(json.dumps({"run_id": f"r{i}", "input": "q?", "output": "a."}) + "\n" for i in range(4)))
    out = tmp_path / "scores.jsonl"
    result = CliRunner().invoke(
        cli,
        ["score", str(runs), "--scorers", SCORERS, "--scorer", "costly", "--out", str(out)],
        env={"TRACESCORE_PRICES": PRICES, "TRACESCORE_BUDGETS": '{"total": 0}'},
    )
    assert fake_llm.count() == 0, result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 4
    assert {r["error_type"] for r in records} == {"budget_exhausted"}


def test_score_records_and_summary_show_what_the_judges_cost(fake_llm: FakeLLMServer, tmp_path: Path) -> None:
    """`score --out` records carried no judge calls or cost, and its summary no spend (cost
    audit): they do, as the backfill's do, a failed run's calls included."""
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(json.dumps({"run_id": f"r{i}", "input": "q?", "output": "a."}) + "\n" for i in range(3)))
    fake_llm.rule(Reply.error(503, "overloaded"), user_contains="RETRY")
    out = tmp_path / "scores.jsonl"
    result = CliRunner().invoke(
        cli,
        ["score", str(runs), "--scorers", SCORERS, "--scorer", "costly", "--scorer", "retrying", "--out", str(out)],
        # One try (the runs' retries: test_score_retries_a_run_as_the_retry_budget_says).
        env={"TRACESCORE_PRICES": PRICES, "TRACESCORE_BUDGETS": "", "TRACESCORE_RETRY_BUDGET": "0"},
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    paid = [r for r in records if r["scorer_id"] == "costly"]
    failed = [r for r in records if r["scorer_id"] == "retrying"]
    assert len(paid) == len(failed) == 3, result.output
    assert all(r["judge_calls"] == 1 and r["judge_models"] == ["openai/fake-judge"] for r in paid)
    assert all(r["cost_usd"] > 0 for r in paid)
    # Four attempts each (the first and three retries), none answered: calls without a cost.
    assert all(r["error_type"] and r["judge_calls"] == 4 and r["cost_usd"] == 0 for r in failed)
    assert fake_llm.count() == 3 + 12
    total = sum(r["cost_usd"] for r in paid)
    assert f"judge spend       {total:.4f} USD   (15 judge calls)" in result.stderr
    assert f"scorer costly: {total:.4f} USD" in result.stderr


def _score(tmp_path: Path, scorer: str, runs: int = 1, **env: str) -> tuple[Result, list[dict[str, Any]]]:
    """`tracescore score` of ``runs`` runs with ``scorer``: the result and its --out records."""
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps({"run_id": f"r{i}", "input": "q?", "output": "a."}) + "\n" for i in range(runs)))
    out = tmp_path / "scores.jsonl"
    result = CliRunner().invoke(
        cli,
        ["score", str(path), "--scorers", SCORERS, "--scorer", scorer, "--out", str(out)],
        env={"TRACESCORE_PRICES": PRICES, "TRACESCORE_BUDGETS": "", **env},
    )
    return result, [json.loads(line) for line in out.read_text().splitlines()]


def test_score_retries_a_run_as_the_retry_budget_says(fake_llm: FakeLLMServer, tmp_path: Path) -> None:
    """Issue 11: `tracescore score` failed a run on a judge's 503 that outlasted the scorer's
    own retries, where backfill (and a worker) tries it 1 + RETRY_BUDGET times. It retries the
    same way now: only the pair that failed (one request more, not one per run), one record
    for it. RETRY_BUDGET=0: the 503 is the run's failure at once; =4: four 503s are outlasted."""
    fake_llm.rule(Reply.error(503, "overloaded"), user_contains="PLAIN", times=1)
    result, records = _score(tmp_path, "plain", runs=2, TRACESCORE_RETRY_BUDGET="0")
    assert len(fake_llm.requests) == 2, result.output
    assert sorted(r.get("error_type") or "" for r in records) == ["", "JudgeServerError"]

    fake_llm.reset()
    fake_llm.rule(Reply.error(503, "overloaded"), user_contains="PLAIN", times=1)
    result, records = _score(
        tmp_path / "once", "plain", runs=2, TRACESCORE_RETRY_BUDGET="1", TRACESCORE_RETRY_BACKOFF_SECONDS="0"
    )
    assert result.exit_code == 0, result.output
    assert len(fake_llm.requests) == 3  # the failed pair's retry alone
    scored = sorted((r["run_id"], r.get("error_type"), r["score"]) for r in records)
    assert scored == [("r0", None, 0.5), ("r1", None, 0.5)]

    fake_llm.reset()
    fake_llm.rule(Reply.error(503, "overloaded"), user_contains="PLAIN", times=4)
    result, records = _score(
        tmp_path / "more", "plain", TRACESCORE_RETRY_BUDGET="4", TRACESCORE_RETRY_BACKOFF_SECONDS="0"
    )
    assert result.exit_code == 0, result.output
    assert len(fake_llm.requests) == 5
    assert [(r.get("error_type"), r["score"]) for r in records] == [(None, 0.5)]
    assert "1 scored, 0 not scorable, 0 failed" in result.stderr


def test_score_retry_waits_the_backoff_and_resumes_after_the_answered_steps(
    fake_llm: FakeLLMServer, tmp_path: Path
) -> None:
    """A two-step judge scorer whose second step answers 503 once, under `tracescore score`:
    the retry comes RETRY_BACKOFF_SECONDS later, asks the second step only (the first one's
    answer is not paid twice), and the record and the summary's spend count what backfill's
    do for the same run (test_a_batch_retry_resumes_after_the_judge_steps_answered): the
    record its answered steps and last try, the spend every call (the 503 too), as paid."""
    fake_llm.rule(Reply.error(503, "overloaded"), user_contains="GRADE", times=1)
    result, records = _score(tmp_path, "two-steps", TRACESCORE_RETRY_BUDGET="1", TRACESCORE_RETRY_BACKOFF_SECONDS="1")
    assert result.exit_code == 0, result.output
    assert [r.user_text.split()[0] for r in fake_llm.requests] == ["CLAIMS", "GRADE", "GRADE"]
    failed, retried = (r.received_at for r in fake_llm.requests[1:])
    assert retried - failed >= 1.0
    (record,) = records
    assert (record.get("error_type"), record["score"], record["judge_calls"]) == (None, 0.5, 2)
    assert f"judge spend       {record['cost_usd']:.4f} USD   (3 judge calls)" in result.stderr


def test_score_holds_the_judge_call_cap_across_its_tries(fake_llm: FakeLLMServer, tmp_path: Path) -> None:
    """`tracescore score` held no TRACESCORE_MAX_JUDGE_ATTEMPTS_PER_RUN: a judge that always
    answers 429 got the scorer's four attempts (and, retried, four per try). It holds the cap as
    backfill does: =2, two calls, then the run's failure saying so; by default (4 attempts and
    one per retry of RETRY_BUDGET 3) 7 calls across its tries, where uncapped they were 16."""
    fake_llm.rule(Reply.rate_limited(retry_after="0"), user_contains="RETRY")
    result, records = _score(
        tmp_path, "retrying", TRACESCORE_MAX_JUDGE_ATTEMPTS_PER_RUN="2", TRACESCORE_RETRY_BACKOFF_SECONDS="0"
    )
    assert len(fake_llm.requests) == 2, result.output
    (record,) = records
    assert record["error_type"] == "JudgeRateLimitError"
    assert "2 judge call(s) of this run failed" in record["error_message"]

    fake_llm.reset()
    fake_llm.rule(Reply.rate_limited(retry_after="0"), user_contains="RETRY")
    result, records = _score(tmp_path / "default", "retrying", TRACESCORE_RETRY_BACKOFF_SECONDS="0")
    assert len(fake_llm.requests) == 7, result.output
    assert "7 judge call(s) of this run failed" in records[0]["error_message"]
