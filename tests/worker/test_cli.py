"""The worker's commands: worker, scores, dlq list|retry, status (Redis DB 11)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import click
import pytest
import redis

from tests._redis import RedisServer
from tests.worker._batches import batch, payload, request
from tests.worker._workers import CELERY, ROOT, TRACESCORE, failed_start, read_scores, run_tracescore, wait_for
from tracing import CelerySink, ScoreBatch
from tracing._broker import redact
from tracing._score_record import ScoreRecord, score_id_for
from tracing.queue import plain_id
from worker import _keys
from worker._heartbeat import READY_FILE
from worker.cli import main
from worker.store import (
    DeadLetter,
    RedisDeadLetters,
    RedisOutbox,
    RedisScoreStore,
    SinkDeadLetter,
    SyncRedisDeadLetters,
)

# A broker nothing listens on: a command that reached Redis through it would fail.
NOWHERE = "redis://127.0.0.1:1/11"


@pytest.fixture
def env(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """TRACESCORE_* pointing at DB 11 for in-process commands."""
    monkeypatch.setenv("TRACESCORE_BROKER_URL", redis_url)
    monkeypatch.delenv("TRACESCORE_REDIS_URL", raising=False)
    return redis_url


@pytest.fixture
def wrong_env(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """TRACESCORE_BROKER_URL pointing nowhere; the tests pass DB 11 as --broker."""
    monkeypatch.setenv("TRACESCORE_BROKER_URL", NOWHERE)
    monkeypatch.delenv("TRACESCORE_REDIS_URL", raising=False)
    return redis_url


def _store_records(url: str, records: list[ScoreRecord]) -> None:
    async def go() -> None:
        store = RedisScoreStore(url)
        await store.put_records(records, "test", 600)
        await store.close()

    asyncio.run(go())


def _push_letters(url: str, *letters: DeadLetter) -> None:
    async def go() -> None:
        store = RedisDeadLetters(url)
        for letter in letters:
            await store.push(letter)
        await store.close()

    asyncio.run(go())


def test_dlq_list_groups_thousands_in_its_count(env: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`dlq list` said "1001 dead letter(s)" where `status` and `sinks list` say 1,001."""
    letter = DeadLetter(reason="invalid_payload", error="not a ScoreBatch", payload={"x": 1}, retryable=False)
    _push_letters(env, *[letter.model_copy(update={"id": f"dl-{n}"}) for n in range(1001)])
    assert main(["dlq", "list", "--limit", "2"]) == 0
    assert "1,001 dead letter(s), showing 2" in capsys.readouterr().out


def test_scores_shows_the_stored_scores_of_a_trace(env: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`scores --trace` lists each stored score of that trace (and only that trace)."""
    trace, span = "ab" * 16, "cd" * 8
    records = [
        ScoreRecord(
            score_id=score_id_for(trace, span, s, "1"), trace_id=trace, span_id=span, scorer_id=s, score=v, label=lab
        )
        for s, v, lab in (("relevancy", 0.75, "good"), ("toxicity", 0.0, None))
    ]
    other = ScoreRecord(score_id="x" * 64, trace_id="ef" * 16, span_id=span, scorer_id="other", score=1.0)
    _store_records(env, [*records, other])
    assert main(["scores", "--trace", trace]) == 0
    out = capsys.readouterr().out
    assert "relevancy" in out
    assert "0.750 [good]" in out
    assert "toxicity" in out
    assert "other" not in out
    assert main(["scores", "--trace", trace.upper(), "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(r["scorer_id"] for r in lines) == ["relevancy", "toxicity"]
    # A trace with none: exit 1 with --json too (it was 0 with nothing printed), stdout empty.
    for extra in ([], ["--json"]):
        assert main(["scores", "--trace", "ee" * 16, *extra]) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        assert "no scores stored for trace" in captured.err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["status", "--timeout", "nan"], "'nan' is not a finite number"),
        (["status", "--timeout", "0"], "0.0 is not in the range 0.1<=x<=60"),
        (["backfill", "x.jsonl", "--scorers", "examples.scorers", "--wait-timeout", "nan"], "not a finite number"),
        (["backfill", "x.jsonl", "--scorers", "examples.scorers", "--wait-timeout", "-5"], "not in the range x>=0"),
        (["backfill", "x.jsonl", "--scorers", "examples.scorers", "--max-cost", "nan"], "not a finite number"),
        (["score", "x.jsonl", "--scorers", "examples.scorers", "--concurrency", "0"], "not in the range x>=1"),
        (["probe", "live", "--max-age", "inf", "--dir", "."], "'inf' is not a finite number"),
    ],
    ids=lambda v: " ".join(v[:1] + v[-2:]) if isinstance(v, list) else "",
)
def test_option_values_that_mean_nothing_are_usage_errors(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """They ran: --wait-timeout nan waited forever, -5 gave up at once, status --timeout nan
    called a healthy broker unreachable, score --concurrency 0 ran one at a time."""
    assert main(argv) == 2
    assert said in capsys.readouterr().err


def test_verbose_is_taken_after_the_command_too(capsys: pytest.CaptureFixture[str]) -> None:
    """Errors say "run with --verbose"; `tracescore status ... --verbose` was "No such option"."""
    assert main(["sinks", "list", "phonix", "--verbose"]) == 2
    err = capsys.readouterr().err
    assert "No such option" not in err
    assert "'phonix' is not one of" in err


def test_a_sink_name_no_sink_has_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """`sinks list nosuch` printed "unknown sink" and `sinks retry nosuch --all` "0 score(s)
    queued again", both exit 0: a typo looked like an empty backlog."""
    for argv in (["sinks", "list", "phonix"], ["sinks", "retry", "phonix", "--all"]):
        assert main(argv) == 2
        assert "'phonix' is not one of 'otlp', 'jsonl', 'console', 'phoenix'" in capsys.readouterr().err


def test_scores_rejects_a_malformed_trace_id(env: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A trace id that is not 32 hex characters is a usage error (exit 2, as the README's table
    says of a bad option value; it was 1), naming the option."""
    assert main(["scores", "--trace", "nope"]) == 2
    assert "Invalid value for --trace: must be 32 hex characters" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["dlq", "retry"],
        ["dlq", "retry", "x", "--all"],
        ["sinks", "retry", "otlp"],
        ["sinks", "retry", "otlp", "y", "--all"],
    ],
)
def test_retry_without_ids_or_all_or_with_both_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Neither ids nor --all, or both: exit 2 (it was 1), before Redis is asked."""
    assert main([*argv, "--broker", "redis://127.0.0.1:1/0"]) == 2
    assert "or --all (not both)" in capsys.readouterr().err


def test_dlq_list_and_retry(env: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`dlq list` shows dead letters; `dlq retry --all` requeues the retryable ones only."""
    good = DeadLetter(reason="retry_budget_exhausted", error="TimeoutError", payload=payload(range(2), ["length"]))
    bad = DeadLetter(reason="invalid_payload", error="not a ScoreBatch", payload={"x": 1}, retryable=False)

    _push_letters(env, good, bad)
    assert main(["dlq", "list"]) == 0
    out = capsys.readouterr().out
    assert "2 dead letter(s)" in out
    assert good.id in out
    assert "invalid_payload (not retryable)" in out

    assert main(["dlq", "retry", "--all"]) == 0
    captured = capsys.readouterr()
    assert f"requeued {good.id}" in captured.out
    assert f"{bad.id}: not retryable" in captured.err
    client = redis.Redis.from_url(env)
    assert client.llen("tracescore") == 1  # the requeued message waits in the scoring queue
    assert client.llen("tracescore:dlq") == 1
    client.close()
    assert main(["dlq", "retry"]) == 2  # neither ids nor --all: a usage error

    # Only letters that cannot be retried left: --all has nothing to do, and that is no error
    # (it exited 1, "nothing requeued", so a cron job failed for as long as one stayed listed).
    assert main(["dlq", "retry", "--all", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert (said["requeued"], said["not_retryable"]) == ([], [bad.id])
    assert main(["dlq", "retry", bad.id]) == 1  # asked for by id, it is refused
    assert f"{bad.id}: not retryable" in capsys.readouterr().err


def test_dlq_retry_by_ids_exits_0_when_some_were_requeued_and_names_the_others(
    env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """README: a letter asked for by id that cannot be retried is an error, exit 1 only when
    nothing was requeued; --json names each in its place (a script reads which ones failed)."""
    good = DeadLetter(reason="retry_budget_exhausted", error="TimeoutError", payload=payload(range(1), ["length"]))
    bad = DeadLetter(reason="invalid_payload", error="not a ScoreBatch", payload={"x": 1}, retryable=False)
    _push_letters(env, good, bad)
    missing = "0" * 32
    capsys.readouterr()
    assert main(["dlq", "retry", missing, "--json"]) == 1  # nothing requeued
    said = json.loads(capsys.readouterr().out)
    assert said["requeued"] == []
    assert len(said["problems"]) == 1
    assert missing in said["problems"][0]
    assert main(["dlq", "retry", good.id, bad.id, missing, "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["requeued"] == [good.id]
    assert said["not_retryable"] == [bad.id]
    assert len(said["problems"]) == 2, said
    assert any(bad.id in p for p in said["problems"])
    assert any(missing in p for p in said["problems"])
    client = redis.Redis.from_url(env)
    try:
        assert (client.llen("tracescore"), client.llen("tracescore:dlq")) == (1, 1)  # bad stays listed
    finally:
        client.close()


def test_dlq_retry_sends_a_letter_kept_with_a_batch_id_the_screen_now_refuses(env: str) -> None:
    """A letter an earlier release kept with a batch id that is not a plain id (a crash split of a
    125-128 character id made one of 130): sent as it was, the workers refused it, not retryable;
    the producer refused it first (task_message). It goes under a digest of its id."""
    letter = DeadLetter(
        reason="retry_budget_exhausted",
        error="TimeoutError",
        payload={**payload(range(1), ["length"]), "batch_id": "b" * 128 + "/0"},
    )
    _push_letters(env, letter)
    assert main(["dlq", "retry", letter.id]) == 0
    client = redis.Redis.from_url(env)
    try:
        (entry,) = client.lrange("tracescore", 0, -1)
    finally:
        client.close()
    body = json.loads(base64.b64decode(json.loads(entry)["body"]))
    sent = body[0][0]["batch_id"]
    assert plain_id(sent), sent
    assert sent.startswith("dlq-")


def test_dlq_retry_sends_a_letter_past_the_pairs_bound_as_messages_under_it(env: str) -> None:
    """A retryable letter an earlier release kept of a message asking for more (run, scorer id)
    pairs than ``MAX_BATCH_PAIRS`` (1,001 runs x 100 scorers, each run its own request, as that
    release sent them): the workers refuse it whole now, and `dlq retry` refused it as no valid
    ScoreBatch. It goes as messages cut under the bound, every run once, each a plain batch id."""
    from tracing.queue import MAX_BATCH_PAIRS, MAX_SCORER_IDS

    ids = ["length", *(f"s{i}" for i in range(MAX_SCORER_IDS - 1))]
    runs = MAX_BATCH_PAIRS // MAX_SCORER_IDS + 1
    requests = [request(n, ids) for n in range(runs)]
    old = ScoreBatch.model_construct(batch_id="o" * 120, requests=requests).model_dump(mode="json")
    letter = DeadLetter(reason="retry_budget_exhausted", error="SoftTimeLimitExceeded", payload=old)
    _push_letters(env, letter)
    assert main(["dlq", "retry", letter.id]) == 0
    client = redis.Redis.from_url(env)
    try:
        entries = client.lrange("tracescore", 0, -1)
        assert client.llen("tracescore:dlq") == 0
    finally:
        client.close()
    sent = [ScoreBatch.model_validate(json.loads(base64.b64decode(json.loads(e)["body"]))[0][0]) for e in entries]
    assert len(sent) == 2
    assert all(b.pairs() <= MAX_BATCH_PAIRS and plain_id(b.batch_id) for b in sent)
    assert len({b.batch_id for b in sent}) == 2
    sent_runs = sorted(run for b in sent for r in b.requests for run in r.run_ids())
    assert sent_runs == sorted(run for r in requests for run in r.run_ids())


def test_dlq_lists_a_damaged_letter_as_unreadable_and_retries_the_others(
    env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Entries of the dead-letter list that are not letters (not JSON; not UTF-8; a letter whose
    fields have other types, e.g. written by another version) are listed as ``unreadable_dead_letter``
    under an id of their own, not retryable and nothing of them shown; the readable letters are
    listed and retried as before. Before, either failed `dlq list` and `dlq retry` whole."""
    marker = "AGENT-CONTENT-MARKER-dlq"
    good = DeadLetter(reason="retry_budget_exhausted", error="TimeoutError", payload=payload(range(1), ["length"]))

    _push_letters(env, good)
    client = redis.Redis.from_url(env)
    try:
        client.lpush("tracescore:dlq", f"not a letter {marker}")
        client.lpush("tracescore:dlq", b'\xff{"reason": "' + marker.encode() + b'\xfe"}')
        client.lpush("tracescore:dlq", json.dumps({"id": "x", "reason": 5, "payload": marker}))
        assert main(["dlq", "list", "--json"]) == 0
        letters = [DeadLetter.model_validate_json(line) for line in capsys.readouterr().out.splitlines()]
        assert [d.reason for d in letters] == ["unreadable_dead_letter"] * 3 + [good.reason]
        assert len({d.id for d in letters}) == 4
        assert all(not d.retryable and d.payload is None for d in letters[:3])
        assert "reason (string_type)" in letters[0].error
        assert main(["dlq", "list"]) == 0
        listed = capsys.readouterr().out
        assert "4 dead letter(s)" in listed
        assert marker not in listed

        assert main(["dlq", "retry", "--all"]) == 0
        captured = capsys.readouterr()
        assert f"requeued {good.id}" in captured.out
        for letter in letters[:3]:
            assert f"{letter.id}: not retryable (unreadable_dead_letter)" in captured.err
        assert marker not in captured.out + captured.err
        assert client.llen("tracescore") == 1
        assert client.llen("tracescore:dlq") == 3  # the damaged entries stay for the operator
    finally:
        client.close()


def test_dlq_drop_removes_letters_by_id_by_reason_or_all_and_the_counts_follow(
    env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Letters that will never be retried (damaged entries, a producer's bad messages) stayed
    listed and counted for good: `dlq retry` refuses them and nothing removed them but redis-cli.
    `dlq drop` removes them by id, by reason or all, and the counts by reason follow (an emptied
    list counts nothing, whatever the damaged entries were counted under when pushed)."""
    marker = "AGENT-CONTENT-MARKER-drop"
    good = DeadLetter(reason="retry_budget_exhausted", error="TimeoutError", payload=payload(range(1), ["length"]))
    bad = DeadLetter(reason="invalid_payload", error="not a ScoreBatch", payload={"x": 1}, retryable=False)
    other = DeadLetter(reason="invalid_payload", error="not a ScoreBatch", payload={"x": 2}, retryable=False)
    _push_letters(env, good, bad, other)
    client = redis.Redis.from_url(env)
    try:
        client.lpush("tracescore:dlq", f"not a letter {marker}")
        client.hincrby("tracescore:dlq:reasons", "not_json", 1)  # what it was counted under
        assert main(["dlq", "list", "--json"]) == 0
        damaged = DeadLetter.model_validate_json(capsys.readouterr().out.splitlines()[0])
        assert damaged.reason == "unreadable_dead_letter"

        assert main(["dlq", "drop", bad.id, "nope"]) == 1  # one dropped, one not there: named
        captured = capsys.readouterr()
        assert f"dropped {bad.id} (invalid_payload, batch -)" in captured.out
        assert "nope: no such dead letter" in captured.err
        assert client.hget("tracescore:dlq:reasons", "invalid_payload") == b"1"

        assert main(["dlq", "drop", "--reason", "unreadable_dead_letter", "--yes", "--json"]) == 0
        said = json.loads(capsys.readouterr().out)
        assert (said["dropped"], said["problems"]) == ([damaged.id], [])
        assert client.llen("tracescore:dlq") == 2

        assert main(["dlq", "drop", "--reason", "unreadable_dead_leter", "--yes"]) == 0  # (a typo)
        assert "no dead letter of reason 'unreadable_dead_leter' is listed" in capsys.readouterr().err
        assert main(["dlq", "drop", "--all"]) == 2  # removing every letter is asked for twice
        assert "--yes" in capsys.readouterr().err
        assert main(["dlq", "drop", "--all", "--yes"]) == 0
        captured = capsys.readouterr()
        assert f"dropped {good.id}" in captured.out
        assert f"dropped {other.id}" in captured.out
        assert marker not in captured.out + captured.err
        assert client.llen("tracescore:dlq") == 0
        assert client.hgetall("tracescore:dlq:reasons") == {}  # not_json's count went with the list
    finally:
        client.close()
    assert main(["dlq", "drop", "--all", "--yes"]) == 0  # nothing to drop is no failure
    assert "0 dropped" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["dlq", "drop"],
        ["dlq", "drop", "x", "--all"],
        ["dlq", "drop", "--all", "--reason", "y"],
        ["dlq", "drop", "x", "--reason", "y"],
    ],
)
def test_dlq_drop_takes_ids_or_all_or_one_reason(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--yes", "--broker", "redis://127.0.0.1:1/0"]) == 2
    assert "give dead letter ID(s), --reason or --all (one of them)" in capsys.readouterr().err


def test_dlq_drop_leaves_a_letter_another_retry_is_sending(env: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A letter a `dlq retry` holds (it is sending it) is not dropped under it: the retry's take
    would find it gone after the message was sent, and say another caller removed it."""
    letter = DeadLetter(reason="retry_budget_exhausted", error="TimeoutError", payload=payload(range(1), ["length"]))
    _push_letters(env, letter)

    async def hold() -> bool:
        store = RedisDeadLetters(env)
        try:
            return await store.hold(letter.id, 60)
        finally:
            await store.close()

    assert asyncio.run(hold())
    assert main(["dlq", "drop", letter.id]) == 1
    assert f"{letter.id}: being requeued by a `tracescore dlq retry`" in capsys.readouterr().err
    client = redis.Redis.from_url(env)
    try:
        assert client.llen("tracescore:dlq") == 1
    finally:
        client.close()


@pytest.mark.parametrize("command", [["dlq", "drop", "--all", "--yes"], ["dlq", "retry", "--all"]])
def test_dlq_retry_and_drop_of_every_letter_read_the_list_a_page_at_a_time(
    env: str, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Each letter taken read the whole list again to find its bytes: n letters cost n reads of
    the list (2,000 letters of 20 KB took 106 s to drop; 100,000 would take days), and the
    command held every letter at once. The list is read a page at a time, oldest first, and each
    letter taken by the bytes its page read: a few reads of the list in all, whatever its size."""
    letters = [
        DeadLetter(
            reason="retry_budget_exhausted", error="TimeoutError", payload=payload(range(1), ["length"], salt=str(n))
        )
        for n in range(450)
    ]
    _push_letters(env, *letters)
    client = redis.Redis.from_url(env)
    try:
        client.config_resetstat()
        assert main(command) == 0
        calls = client.info("commandstats").get("cmdstat_lrange", {}).get("calls", 0)
        assert client.llen("tracescore:dlq") == 0
    finally:
        client.close()
    assert calls <= 5, calls  # (pages of 200: 200, 200, 50, then none)
    out = capsys.readouterr().out
    assert out.index(letters[0].id) < out.index(letters[-1].id)  # the oldest first


def test_dlq_retry_interrupted_mid_send_keeps_the_letter(
    env: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `dlq retry` interrupted while sending leaves the dead letter listed instead of losing it."""
    letter = DeadLetter(reason="retry_budget_exhausted", error="TimeoutError", payload=payload(range(1), ["length"]))

    _push_letters(env, letter)

    def interrupted(self: CelerySink, batch: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(CelerySink, "send", interrupted)
    assert main(["dlq", "retry", letter.id]) == 130
    capsys.readouterr()
    client = redis.Redis.from_url(env)
    try:
        assert [DeadLetter.model_validate_json(raw).id for raw in client.lrange("tracescore:dlq", 0, -1)] == [letter.id]
    finally:
        client.close()


def test_two_dlq_retries_at_once_send_a_letter_once(env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second `dlq retry` running while the first sends the letter back: the letter goes to the
    queue once, and the second says another retry has it. Before, both sent it and both said
    "requeued": one refused message became two on the queue (two dead letters if it failed again)."""
    from worker._admin import requeue_dead_letters
    from worker._settings import load_settings

    letter = DeadLetter(reason="retry_budget_exhausted", error="TimeoutError", payload=payload(range(1), ["length"]))
    _push_letters(env, letter)
    settings = load_settings()
    send = CelerySink.send
    second: list[tuple[list[DeadLetter], list[str]]] = []
    sends: list[str] = []

    def send_while_another_retries(self: CelerySink, batch: ScoreBatch) -> None:
        sends.append(batch.batch_id)
        if len(sends) == 1:  # the first sender: another operator's retry runs now, to its end
            other = threading.Thread(target=lambda: second.append(asyncio.run(requeue_dead_letters(settings, None))))
            other.start()
            other.join(30)
        send(self, batch)

    monkeypatch.setattr(CelerySink, "send", send_while_another_retries)
    requeued, problems, _ = asyncio.run(requeue_dead_letters(settings, None))
    assert ([d.id for d in requeued], problems) == ([letter.id], [])
    ((other_requeued, other_problems, _),) = second
    assert other_requeued == []
    assert other_problems == [f"{letter.id}: being requeued by another `tracescore dlq retry`"]
    assert len(sends) == 1
    client = redis.Redis.from_url(env)
    try:
        assert (client.llen("tracescore"), client.llen("tracescore:dlq")) == (1, 0)
    finally:
        client.close()


def test_a_dlq_retry_that_listed_a_letter_another_retry_then_sent_does_not_send_it_again(
    env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retry B lists the letters; retry A sends and takes one before B gets to it. B found it
    free (A had released its hold after the take) and sent it again. A's hold stays until it
    lapses, so B says another retry has it."""
    from worker._admin import requeue_dead_letters
    from worker._settings import load_settings

    letter = DeadLetter(reason="retry_budget_exhausted", error="TimeoutError", payload=payload(range(1), ["length"]))
    _push_letters(env, letter)
    settings = load_settings()
    hold = RedisDeadLetters.hold
    first: list[tuple[list[DeadLetter], list[str]]] = []
    holds: list[str] = []

    async def a_runs_first(self: RedisDeadLetters, letter_id: str, ttl_s: float) -> bool:
        holds.append(letter_id)
        if len(holds) == 1:  # B has listed the letter: A runs now, to its end
            other = threading.Thread(target=lambda: first.append(asyncio.run(requeue_dead_letters(settings, None))))
            other.start()
            other.join(30)
        return await hold(self, letter_id, ttl_s)

    monkeypatch.setattr(RedisDeadLetters, "hold", a_runs_first)
    requeued, problems, _ = asyncio.run(requeue_dead_letters(settings, None))
    ((a_requeued, a_problems, _),) = first
    assert ([d.id for d in a_requeued], a_problems) == ([letter.id], [])
    assert (requeued, problems) == ([], [f"{letter.id}: being requeued by another `tracescore dlq retry`"])
    client = redis.Redis.from_url(env)
    try:
        assert (client.llen("tracescore"), client.llen("tracescore:dlq")) == (1, 0)
    finally:
        client.close()


def test_a_dlq_retry_whose_send_failed_leaves_the_letter_to_the_next_at_once(
    env: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker blips during a `dlq retry`: the letter stays, and a retry right after sends it.
    The first one kept its hold, so for a minute every retry said another retry had it."""
    letter = DeadLetter(reason="retry_budget_exhausted", error="TimeoutError", payload=payload(range(1), ["length"]))
    _push_letters(env, letter)
    send = CelerySink.send

    def blip(self: CelerySink, batch: ScoreBatch) -> None:
        raise ConnectionError("broker blip")

    monkeypatch.setattr(CelerySink, "send", blip)
    assert main(["dlq", "retry", letter.id]) == 1
    assert "could not requeue: ConnectionError" in capsys.readouterr().err
    monkeypatch.setattr(CelerySink, "send", send)
    assert main(["dlq", "retry", letter.id]) == 0
    assert f"requeued {letter.id}" in capsys.readouterr().out
    client = redis.Redis.from_url(env)
    try:
        assert (client.llen("tracescore"), client.llen("tracescore:dlq")) == (1, 0)
    finally:
        client.close()


def test_status_is_a_health_check(
    env: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`status` exits 0 with the queue figures when the broker answers, 1 when it does not."""
    CelerySink(env).send(batch(range(1), ["length"]))
    assert main(["status", "--json", "--timeout", "0.3"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["queue_depth"] == 1
    assert status["workers"] == []
    assert status["broker_full"] is False
    assert status["broker_read_only"] is False
    assert status["dead_letters"] == 0
    assert status["refused_keys"] == []
    monkeypatch.setenv("TRACESCORE_BROKER_URL", NOWHERE)
    assert main(["status"]) == 1
    assert "cannot reach the broker at" in capsys.readouterr().err


def test_status_exits_1_naming_the_score_store_when_only_the_store_is_down(
    env: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker answers, TRACESCORE_REDIS_URL's store does not: `status` exits 1 naming the
    store, stdout empty (a health check's figures would be half of them)."""
    monkeypatch.setenv("TRACESCORE_REDIS_URL", NOWHERE)
    capsys.readouterr()
    assert main(["status", "--json", "--timeout", "0.3"]) == 1
    said = capsys.readouterr()
    assert said.out == ""
    assert f"cannot reach the score store at {NOWHERE}" in said.err


def test_status_names_a_refused_key_and_shows_the_rest(env: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The dead-letter list and a sink's queue holding another Redis type: `status` still answers
    (exit 0) with every other figure; those two are unknown and their keys named, never deleted."""
    from worker import _keys

    client = redis.Redis.from_url(env)
    client.set(_keys.dlq_key(), "someone else's")
    client.sadd(_keys.outbox_sinks_key(), "otlp")
    client.set(_keys.outbox_key("otlp"), "someone else's")
    CelerySink(env).send(batch(range(1), ["length"]))
    try:
        assert main(["status", "--json", "--timeout", "0.3"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["queue_depth"] == 1
        assert status["dead_letters"] is None
        assert status["sinks"] is None
        refused = status["refused_keys"]
        assert len(refused) == 2
        assert _keys.dlq_key() in refused[0]
        assert _keys.outbox_key("otlp") in refused[1]
        assert main(["status", "--timeout", "0.3"]) == 0
        text = capsys.readouterr().out
        assert "dead letters unknown" in text
        assert f"refused key Redis key {_keys.dlq_key()} holds a string" in text
        assert "someone else's" not in text  # names, never values
        assert client.get(_keys.dlq_key()) == b"someone else's"
        # The commands that need that key name it in one line, not as an unexpected error.
        assert main(["dlq", "list"]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: Redis key {_keys.dlq_key()} holds a string"), err
        assert "--verbose" not in err
        assert len(err.strip().splitlines()) == 1
    finally:
        client.close()


def test_status_says_the_dead_letters_dropped_past_the_lists_bound(
    env: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A worker's refusals past TRACESCORE_DLQ_MAX_LETTERS or TRACESCORE_DLQ_MAX_BYTES drop the
    oldest letters: `status` says how many, by reason, beside the letters listed and their bytes
    against the byte bound (the workers' screen and the task both push with the settings' bounds).
    `dlq drop` takes a letter's bytes off the total."""
    from worker._settings import load_settings

    monkeypatch.setenv("TRACESCORE_DLQ_MAX_LETTERS", "3")
    letters = [
        DeadLetter(reason=reason, message_key=f"msg:{n}", payload={"input": "x" * size})
        for n, (reason, size) in enumerate([("not_json", 0), ("bad_headers", 0), ("not_json", 3000), ("not_json", 0)])
    ]
    sizes = [len(letter.model_dump_json().encode()) for letter in letters]
    monkeypatch.setenv("TRACESCORE_DLQ_MAX_BYTES", str(sum(sizes[1:]) - 1))  # the bad_headers one goes too
    settings = load_settings()
    assert (settings.dlq_max_letters, settings.dlq_max_bytes) == (3, sum(sizes[1:]) - 1)
    sync = SyncRedisDeadLetters(
        settings.store_url, max_letters=settings.dlq_max_letters, max_bytes=settings.dlq_max_bytes
    )
    try:
        for letter in letters:
            assert sync.push(letter)
    finally:
        sync.close()
    capsys.readouterr()  # (the pushes' log lines)
    assert main(["status", "--json", "--timeout", "0.3"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["dead_letters"], status["dead_letters_by_reason"]) == (2, {"not_json": 2})
    assert status["dead_letters_dropped"] == {"not_json": 1, "bad_headers": 1}
    assert (status["dead_letters_bytes"], status["dead_letters_max_bytes"]) == (sum(sizes[2:]), sum(sizes[1:]) - 1)
    assert main(["status", "--timeout", "0.3"]) == 0
    said = capsys.readouterr().out
    assert "dead letters 2 (not_json=2)" in said
    assert f"{sum(sizes[2:]):,} bytes of the bound's {sum(sizes[1:]) - 1:,} (TRACESCORE_DLQ_MAX_BYTES)" in said
    bounds = "(TRACESCORE_DLQ_MAX_LETTERS, TRACESCORE_DLQ_MAX_BYTES)"
    assert f"dropped past the list's bounds {bounds}, the oldest first: " in said
    assert main(["dlq", "drop", letters[2].id]) == 0
    capsys.readouterr()
    assert main(["status", "--json", "--timeout", "0.3"]) == 0
    assert json.loads(capsys.readouterr().out)["dead_letters_bytes"] == sizes[3]


def test_status_shows_a_counter_that_is_not_a_number_unknown(env: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A dead-letter reason or a failure count that is not an integer (a key written by hand,
    or damaged) ended `status` with ValueError, exit 1, as if the broker were down. It is
    unknown (``null``; it was left out, a sink's counter read as 0: tests/worker/test_metrics.py
    has the text and the scrape), named in the log by key and field, and the other figures are
    shown."""
    from worker import _keys
    from worker.store._jobs import failure_bucket

    client = redis.Redis.from_url(env)
    client.hset(_keys.dlq_reasons_key(), mapping={"invalid_payload": 2, "weird": "SECRET"})
    client.hset(_keys.failures_key(failure_bucket()), mapping={"timeout": 3, "odd": "abc"})
    # A sink's counters and the judge limiter's grants (the review found these two after).
    client.sadd(_keys.outbox_sinks_key(), "otlp")
    client.hset(_keys.outbox_counts_key("otlp"), mapping={"delivered": "12x", "retried": 4})
    now = int(client.time()[0])
    client.hset(_keys.limiter_granted_key("m"), mapping={str(now - 2): 3, str(now - 3): "3;x"})
    try:
        assert main(["status", "--json", "--timeout", "0.3"]) == 0
        captured = capsys.readouterr()
        status = json.loads(captured.out)
        assert status["dead_letters_by_reason"] == {"invalid_payload": 2, "weird": None}
        assert status["recent_failures"] == {"timeout": 3, "odd": None}
        assert status["sinks"]["otlp"]["delivered"] is None
        assert status["sinks"]["otlp"]["retried"] == 4
        # (one second's count no number: the minute's is unknown, not the other seconds' 3)
        assert status["rate_limits"]["m"]["calls_last_60s"] is None
        assert captured.err.count("counter_unreadable") == 4
        assert "field=weird" in captured.err
        assert "SECRET" not in captured.err + captured.out
        assert main(["status", "--timeout", "0.3"]) == 0
        text = capsys.readouterr().out
        assert "rate limit  m: calls_last_60s=unknown" in text
        assert "a counter in Redis is no number: sink otlp delivered, dead letters weird, failures odd," in text
        assert "rate limit m calls_last_60s (shown unknown" in text
        assert main(["sinks", "list", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["otlp"]["retried"] == 4
        # The broker-mode backfill polls its job's counters: a total that is no integer is summed
        # again from its reasons, as a put does (left out, the job's wait never reached its total).
        from worker._settings import load_settings
        from worker.backfill._submit import RedisSubmitter

        client.hset(_keys.job_key("job1"), mapping={"scored": 5, "failed": "7x", "failed:timeout": 2})
        submitter = RedisSubmitter(load_settings(broker_url=env))
        try:
            assert submitter.progress("job1") == {"scored": 5, "failed": 2, "failed:timeout": 2}
        finally:
            submitter.close()
    finally:
        client.close()


def test_status_prints_names_from_redis_without_their_control_characters(
    env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Scorer, model and reason names come from Redis, which anyone who can write there
    chooses: an escape sequence in one reached the terminal (retitling it). Each control
    character is shown as U+FFFD, as everywhere the CLI prints such text."""
    from worker import _keys
    from worker._budget import utc_day

    client = redis.Redis.from_url(env)
    client.hset(_keys.spend_key(utc_day()), mapping={"scorer:evil\x1b]0;PWNED\x07": 0.5, "total": 0.5})
    client.hset(_keys.dlq_reasons_key(), mapping={"odd\x1b[2J": 1})
    try:
        assert main(["status", "--timeout", "0.3"]) == 0
        text = capsys.readouterr().out
        assert "evil\ufffd]0;PWNED\ufffd: 0.5000 USD" in text
        assert "odd\ufffd[2J=1" in text
        assert "\x1b" not in text
        assert "\x07" not in text
        client.sadd(_keys.outbox_sinks_key(), "evil\x1b]0;PWNED\x07")
        assert main(["sinks", "list"]) == 0
        listed = capsys.readouterr().out
        assert "evil\ufffd]0;PWNED\ufffd: 0 delivered" in listed
        assert "\x1b" not in listed
    finally:
        client.close()


def test_commands_reach_a_broker_on_a_unix_socket(capsys: pytest.CaptureFixture[str]) -> None:
    """`redis+socket://` is a broker URL the settings take (kombu's Unix-socket form), but every
    command that talks to Redis itself passed it to redis-py, which reads `unix://`: each failed
    with "Redis URL must specify one of the following schemes". Its database (`virtual_host`)
    is the one read."""
    from tests._redis import RedisServer

    server = RedisServer(unix_socket=True)
    server.start()
    try:
        server.client(5).lpush("tracescore", "a message")
        url = f"redis+socket://:{server.password}@{server.socket_path}?virtual_host=5"
        assert main(["status", "--json", "--timeout", "0.3", "--broker", url]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["queue_depth"] == 1
        assert server.password not in status["broker"]
        assert main(["dlq", "list", "--json", "--broker", url]) == 0  # one JSON line a letter: none
        assert capsys.readouterr().out == ""
    finally:
        server.close()


def test_a_queue_key_of_another_type_is_named_by_status_and_refused_by_backfill(
    env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The queue's own key holding another Redis type: `status` answered "broker unreachable"
    (WRONGTYPE) and `backfill` failed on its first publish with Redis' bare WRONGTYPE. Now status
    shows the rest with the depth unknown and the key named; backfill refuses before it starts
    a job, naming the key. The key is left as it is."""
    from worker._keys import backfill_state_key

    client = redis.Redis.from_url(env)
    client.set("tracescore", "someone else's")
    try:
        assert main(["status", "--json", "--timeout", "0.3"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["queue_depth"] is None
        assert status["unacked"] == 0
        (refused,) = status["refused_keys"]
        assert refused.startswith("the broker's queue: Redis key tracescore holds a string")
        assert main(["status", "--timeout", "0.3"]) == 0
        assert "queue depth unknown waiting" in capsys.readouterr().out

        examples = ROOT / "examples" / "traces"
        assert main(["backfill", str(examples), "--scorers", "examples.scorers"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("Error: the broker's queue: Redis key tracescore holds a string"), err
        assert len(err.strip().splitlines()) == 1
        assert "someone else's" not in err
        assert client.keys(backfill_state_key("*")) == []  # no job was started
        assert client.get("tracescore") == b"someone else's"
    finally:
        client.close()


def test_a_queue_key_changing_type_mid_backfill_stops_it_with_a_resume_and_loses_nothing(
    redis_url: str, tmp_path: Path
) -> None:
    """The queue's key turns into a string while a backfill waits on backpressure (no worker):
    it ended with a bare StoreKeyTypeError and no word of resuming. Now one line names the key
    and gives the resume command; resumed once the list is back, every run is queued once."""
    import base64
    import re

    from tests.backfill._synth import write_otlp_files
    from tracing.queue import ScoreBatch

    data = tmp_path / "traces"
    write_otlp_files(data, 200, files=2, traces_per_line=10)
    env = {**os.environ, "TRACESCORE_BROKER_URL": redis_url, "PYTHONPATH": str(ROOT)}
    command = [TRACESCORE, "backfill", str(data), "--scorers", "bench.backfill_scorers", "--batch-size", "10"]
    client = redis.Redis.from_url(redis_url)
    proc = subprocess.Popen(
        [*command, "--no-wait", "--high-water", "3"], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        # Held by backpressure: 4 batches waiting (over the high-water mark of 3), no worker.
        assert wait_for(lambda: client.llen("tracescore") >= 4 or proc.poll() is not None, 60)
        assert proc.poll() is None
        swap = client.pipeline(transaction=True)  # atomic: the backfill never sees the key absent
        swap.rename("tracescore", "tracescore-aside")
        swap.set("tracescore", "someone else's")
        swap.execute()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err[-2000:]
    lines = err.strip().splitlines()
    assert lines[-1].startswith("Error: the broker's queue: Redis key tracescore holds a string"), err[-2000:]
    assert "Once it is moved aside, resume with: tracescore backfill --resume" in lines[-1]
    assert "someone else's" not in err
    found = re.search(r"--resume (\S+)", lines[-1])
    assert found is not None

    restore = client.pipeline(transaction=True)
    restore.delete("tracescore")
    restore.rename("tracescore-aside", "tracescore")
    restore.execute()
    resumed = run_tracescore("backfill", "--resume", found.group(1), "--no-wait", env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    runs: list[tuple[str, str]] = []
    for raw in client.lrange("tracescore", 0, -1):
        message = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        batch = ScoreBatch.model_validate(args[0])
        runs += [(r.trace_id, span_id) for r in batch.requests for span_id in r.target_span_ids]
    assert len(runs) == len(set(runs)) == 200  # every run queued, none twice
    client.close()


def test_worker_command_starts_a_worker_that_scores(redis_url: str, tmp_path: Path) -> None:
    """`tracescore worker` says which broker it uses, starts, and scores what is queued."""
    scores = tmp_path / "scores.jsonl"
    log = tmp_path / "worker.log"
    env = {
        **os.environ,
        "TRACESCORE_BROKER_URL": redis_url,
        "TRACESCORE_WRITER": "jsonl",
        "TRACESCORE_WRITER_PATH": str(scores),
        "PYTHONPATH": str(ROOT),
    }
    cmd = [
        TRACESCORE,
        "worker", "--scorers", "tests.worker.sample_scorers", "--concurrency", "2",
    ]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert wait_for(lambda: " ready." in log.read_text() or proc.poll() is not None, 60), log.read_text()
        text = log.read_text()
        assert "Redis mode" in text
        assert redis_url.rpartition("@")[2] in text  # host:port/db shown ...
        assert redis_url.split("@")[0].rpartition(":")[2] not in text  # ... the password never
        assert "pool threads x2" in text
        sink = CelerySink(redis_url)
        sink.send(batch(range(5), ["length", "steps"], salt="cli"))
        sink.close()
        assert wait_for(lambda: len(read_scores(scores)) >= 10, 30), log.read_text()[-2000:]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


@pytest.mark.parametrize(
    ("command", "pool", "says"),
    [
        ("tracescore", "solo", ["pool solo x1,", "concurrency: 1 (solo)"]),
        ("celery", "solo", ["concurrency: 1 (solo)"]),
        ("tracescore", "threads", ["pool threads x3,", "concurrency: 3 (thread)"]),
        ("tracescore", "prefork", ["pool prefork x3,", "concurrency: 3 (prefork)"]),
    ],
)
def test_a_worker_says_how_many_messages_it_handles_at_once(
    command: str, pool: str, says: list[str], redis_url: str, tmp_path: Path
) -> None:
    """`--pool solo --concurrency 3` (or solo with the default 8) handles one message at a time,
    but our start line said "pool solo x3" and Celery's banner "concurrency: 3 (solo)" (by
    `celery -A worker worker` too). A solo worker now says 1, by either command; the threads and
    prefork pools say the number given (that many threads, that many children)."""
    log = tmp_path / "worker.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACESCORE_")}
    env.update({"TRACESCORE_BROKER_URL": redis_url, "TRACESCORE_WRITER": "none", "PYTHONPATH": str(ROOT)})
    head = [TRACESCORE, "worker"] if command == "tracescore" else [CELERY, "-A", "worker", "worker", "-l", "INFO"]
    cmd = [*head, "--scorers", "tests.worker.sample_scorers", "--pool", pool, "--concurrency", "3"]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert wait_for(lambda: " ready." in log.read_text() or proc.poll() is not None, 60), log.read_text()
        text = log.read_text()
        assert proc.poll() is None, text[-3000:]
        for line in says:
            assert line in text, text[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def test_worker_command_rejects_a_missing_scorer_module(capsys: pytest.CaptureFixture[str]) -> None:
    """A scorer module that cannot be imported fails at once with one clear line."""
    assert main(["worker", "--scorers", "no_such_module_here"]) == 1
    assert "cannot import scorer module 'no_such_module_here'" in capsys.readouterr().err


@pytest.mark.parametrize("given", ["examples/scorers.py", "./examples/scorers.py", "examples/scorers"])
def test_a_scorer_module_given_as_a_file_path_is_named_as_its_module(
    given: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--scorers examples/scorers.py` (a path, as a new user types it) said only "No module named
    'examples/scorers'": the line now says a module name is wanted and which one that file is."""
    monkeypatch.chdir(ROOT)
    assert main(["worker", "--scorers", given, "--broker", NOWHERE]) == 1
    err = capsys.readouterr().err
    assert f"cannot import scorer module {given!r}" in err
    assert "a file path: give the module's name, --scorers examples.scorers" in err, err


def test_a_database_the_redis_does_not_have_is_named_by_the_worker_and_the_commands(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """redis://host/99 (a Redis has databases 0-15 unless configured): the commands said "cannot
    reach the broker ...: DB index is out of range", and the worker logged "Cannot connect" every
    few seconds for good, as for a broker that is down: no retry fixes it. Both now name the
    database and where to fix it; the worker exits 1 at once, as on a refused password."""
    url = redis_server.url(99)
    assert main(["status", "--broker", url]) == 1
    err = capsys.readouterr().err
    assert "the broker at redis://:***@" in err, err
    assert "has no database 99" in err, err
    done = failed_start(url)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "tracescore worker cannot start: the broker at redis://:***@" in done.stderr, done.stderr[-2000:]
    assert "has no database 99" in done.stderr
    assert redis_server.password not in done.stdout + done.stderr + err


def test_celery_worker_with_a_bad_scorer_module_exits_with_one_line(redis_url: str) -> None:
    """`celery -A worker worker --scorers <missing>` exits 1 saying what is wrong."""
    done = failed_start(redis_url, scorers="no_such.scorers")
    assert done.returncode == 1
    assert "tracescore worker cannot start: cannot import scorer module 'no_such.scorers'" in done.stderr


def _leaf_commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    found: dict[str, click.Command] = {}
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, f"{prefix}{name} is listed but cannot be loaded"
        if isinstance(command, click.Group):
            found.update(_leaf_commands(command, f"{prefix}{name} "))
        else:
            found[f"{prefix}{name}"] = command
    return found


# Every command, by whether it talks to Redis; a new command must be placed here.
TALKS_TO_REDIS = {
    "status",
    "scores",
    "dlq list",
    "dlq retry",
    "dlq drop",
    "sinks list",
    "sinks retry",
    "sinks drop",
    "worker",
    "probe ready",
}
NO_REDIS = {"score", "compare", "probe live"}  # in-process scoring, two files, the probe files
# Their answer is not output for scripts: a long-running process; a probe's exit status.
NO_JSON = {"worker", "probe live", "probe ready"}


def test_redis_commands_share_one_broker_option_and_json() -> None:
    """Every command that talks to Redis takes --broker with the same meaning, and every
    command whose output is meant for scripts takes --json (issue 11: `sinks retry` had none)."""
    from worker.cli import cli
    from worker.cli._common import BROKER_HELP

    commands = _leaf_commands(cli)
    assert set(commands) == TALKS_TO_REDIS | NO_REDIS | {"backfill"}, "place the new command in a set above"
    for name, command in commands.items():
        options = {opt: param for param in command.params for opt in getattr(param, "opts", [])}
        if name in TALKS_TO_REDIS | {"backfill"}:
            assert "--broker" in options, f"tracescore {name} has no --broker"
            broker = options["--broker"]
            assert isinstance(broker, click.Option)
            # backfill's own help: without a broker it scores in its own process
            assert broker.help == BROKER_HELP or name == "backfill", name
            assert broker.envvar is None, name  # one precedence, decided in cli_settings: flag > variable > default
        else:
            assert "--broker" not in options, f"tracescore {name} takes --broker but never talks to Redis"
        assert ("--json" in options) == (name not in NO_JSON), f"tracescore {name}: --json"


def test_broker_flag_wins_over_the_environment(wrong_env: str, capsys: pytest.CaptureFixture[str]) -> None:
    """With TRACESCORE_BROKER_URL pointing nowhere, --broker alone makes status, scores and
    dlq list|retry reach the right Redis (broker and score store)."""
    url = wrong_env
    trace, span = "ab" * 16, "cd" * 8
    _store_records(url, [ScoreRecord(score_id=score_id_for(trace, span, "s", "1"), trace_id=trace, span_id=span,
                                     scorer_id="relevancy", score=0.5)])  # fmt: skip
    letter = DeadLetter(reason="retry_budget_exhausted", error="TimeoutError", payload=payload(range(1), ["length"]))

    _push_letters(url, letter)
    capsys.readouterr()
    assert main(["status", "--json", "--timeout", "0.3"]) == 1  # the environment's broker: down
    assert "cannot reach the broker at" in capsys.readouterr().err

    assert main(["status", "--json", "--timeout", "0.3", "--broker", url]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["dead_letters"] == 1
    assert status["broker"] == redact(url)

    assert main(["scores", "--trace", trace, "--json", "--broker", url]) == 0
    assert [json.loads(line)["scorer_id"] for line in capsys.readouterr().out.splitlines()] == ["relevancy"]

    assert main(["dlq", "list", "--json", "--broker", url]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == [letter.id]

    assert main(["dlq", "retry", "--all", "--json", "--broker", url]) == 0
    assert json.loads(capsys.readouterr().out) == {"requeued": [letter.id], "problems": [], "not_retryable": []}
    client = redis.Redis.from_url(url)
    try:
        assert client.llen("tracescore") == 1  # requeued through the --broker, not the environment's
    finally:
        client.close()


def test_sinks_retry_json_counts_what_was_queued_and_what_was_not_a_dead_letter(
    wrong_env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sinks retry SINK ID... --json`: one object; an id given twice is queued once, an id that
    is not the sink's dead letter is counted and the exit status says so."""
    url = wrong_env
    trace, span = "ab" * 16, "cd" * 8
    record = ScoreRecord(score_id=score_id_for(trace, span, "s", "1"), trace_id=trace, span_id=span, scorer_id="s")

    async def put() -> None:
        store = RedisScoreStore(url, sinks=["otlp"])
        await store.put_records([record], "w1", 600)
        await store.close()

    asyncio.run(put())
    outbox = RedisOutbox(url)
    try:
        lease = outbox.lease("otlp", 10, lease_s=30)
        assert outbox.dead(lease, [SinkDeadLetter(score_id=record.score_id, sink="otlp", reason="http_400")]) == 1
        capsys.readouterr()
        argv = ["sinks", "retry", "otlp", record.score_id, record.score_id, "0" * 64, "--json", "--broker", url]
        assert main(argv) == 1
        out = capsys.readouterr()
        assert json.loads(out.out) == {"sink": "otlp", "queued": 1, "not_dead_letters": 1}
        assert "1 of the given id(s) are not otlp dead letters" in out.err
        assert outbox.dead_letters("otlp") == []
        assert outbox.lease("otlp", 10, lease_s=30).ids == [record.score_id]
    finally:
        outbox.close()


def test_sinks_drop_removes_dead_letters_by_id_reason_or_all_paged_and_the_counts_follow(
    wrong_env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sink's dead letters that will never be sent again (a deleted project's) stayed for good:
    nothing but redis-cli removed them. `sinks drop` removes them by id, by reason or all (those
    two asked first, or --yes off a terminal), says the ids that are no letter and a reason no
    letter has, and the counts follow. 1,500 letters (written as the previous release kept them,
    without their order) are read a page at a time, never the whole hash at once."""
    url = wrong_env
    records = _sink_records(1500)
    client = redis.Redis.from_url(url)
    try:
        with client.pipeline(transaction=False) as pipe:
            for n, record in enumerate(records):
                letter = SinkDeadLetter(
                    score_id=record.score_id, sink="otlp", reason="http_401" if n % 2 else "http_404", detail="no"
                )
                pipe.hset(_keys.outbox_dead_key("otlp"), record.score_id, letter.model_dump_json())
            pipe.sadd(_keys.outbox_sinks_key(), "otlp")
            pipe.execute()
        capsys.readouterr()
        assert main(["sinks", "drop", "otlp", records[0].score_id, "0" * 64, "--broker", url]) == 1
        captured = capsys.readouterr()
        assert f"dropped {records[0].score_id} (http_404)" in captured.out
        assert f"{'0' * 64}: no such otlp dead letter" in captured.err
        assert "1 dropped, 1 not" in captured.err

        assert main(["sinks", "drop", "otlp", "--reason", "http_401", "--broker", url]) == 2  # asked for
        assert "--yes" in capsys.readouterr().err
        client.config_resetstat()
        assert main(["sinks", "drop", "otlp", "--reason", "http_401", "--yes", "--json", "--broker", url]) == 0
        said = json.loads(capsys.readouterr().out)
        assert said == {"sink": "otlp", "dropped": 750, "not_dead_letters": 0}
        stats = client.info("commandstats")
        assert stats["cmdstat_hscan"]["calls"] >= 3  # paged
        assert not {"cmdstat_hgetall", "cmdstat_hkeys", "cmdstat_hvals"} & set(stats)
        assert client.hlen(_keys.outbox_dead_key("otlp")) == 749

        assert main(["sinks", "drop", "otlp", "--reason", "http_4O1", "--yes", "--broker", url]) == 0  # (a typo)
        assert "no otlp dead letter of reason 'http_4O1'" in capsys.readouterr().err
        assert main(["sinks", "list", "otlp", "--json", "--broker", url]) == 0
        listed = json.loads(capsys.readouterr().out)["otlp"]
        assert (listed["failed"], listed["dead_letters_dropped"]) == (749, 0)
        assert main(["sinks", "drop", "otlp", "--all", "--yes", "--broker", url]) == 0
        captured = capsys.readouterr()
        assert "749 dropped, 0 not" in captured.err
        assert client.exists(_keys.outbox_dead_key("otlp"), _keys.outbox_dead_order_key("otlp")) == 0
    finally:
        client.close()
    assert main(["sinks", "drop", "otlp", "--all", "--yes", "--broker", url]) == 0  # nothing to drop is no failure
    assert "0 dropped" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["sinks", "drop", "otlp"],
        ["sinks", "drop", "otlp", "x", "--all"],
        ["sinks", "drop", "otlp", "--all", "--reason", "y"],
        ["sinks", "drop", "otlp", "x", "--reason", "y"],
    ],
)
def test_sinks_drop_takes_ids_or_all_or_one_reason(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--yes", "--broker", "redis://127.0.0.1:1/0"]) == 2
    assert "give score id(s), --reason or --all (one of them)" in capsys.readouterr().err


def test_status_and_sinks_list_say_the_sink_dead_letters_dropped_past_the_bound(
    wrong_env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Letters dropped past TRACESCORE_SINK_MAX_DEAD_LETTERS are counted per sink: `status` and
    `sinks list` show them (text and --json), not as failed."""
    url = wrong_env
    records = _sink_records(5)
    _store_records_for_sink(url, records)
    outbox = RedisOutbox(url, max_dead_letters=2)
    try:
        lease = outbox.lease("otlp", 10, lease_s=30)
        letters = [SinkDeadLetter(score_id=r.score_id, sink="otlp", reason="http_403") for r in records]
        assert outbox.dead(lease, letters) == 5
    finally:
        outbox.close()
    capsys.readouterr()
    assert main(["status", "--json", "--broker", url]) == 0
    sink = json.loads(capsys.readouterr().out)["sinks"]["otlp"]
    assert (sink["failed"], sink["dead_letters_dropped"]) == (2, 3)
    assert main(["status", "--broker", url]) == 0
    assert "3 dead letters dropped past the bound (TRACESCORE_SINK_MAX_DEAD_LETTERS)" in capsys.readouterr().out
    assert main(["sinks", "list", "otlp", "--broker", url]) == 0
    assert "2 failed, 3 dead letters dropped past the bound" in capsys.readouterr().out


def _sink_records(count: int) -> list[ScoreRecord]:
    """``count`` records of scorer ``s``, one trace each, for the sink tests' outbox."""
    return [
        ScoreRecord(score_id=score_id_for(f"{n:032x}", "cd" * 8, "s", "1"), trace_id=f"{n:032x}", span_id="cd" * 8,
                    scorer_id="s")
        for n in range(count)
    ]  # fmt: skip


def _store_records_for_sink(url: str, records: list[ScoreRecord]) -> None:
    async def put() -> None:
        store = RedisScoreStore(url, sinks=["otlp"])
        await store.put_records(records, "w1", 600)
        await store.close()

    asyncio.run(put())


def test_listings_print_no_control_characters_from_traces_or_backends(
    wrong_env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`scores`, `dlq list` and `sinks list` print what traces, judges and backends wrote (span
    names, reasons, errors, a backend's answer): their escape sequences are U+FFFD, as the
    backfill's and compare's output is."""
    url, esc = wrong_env, "\x1b]0;owned\x07\x1b[31m"
    trace, span = "ab" * 16, "cd" * 8
    record = ScoreRecord(
        score_id=score_id_for(trace, span, "s", "1"), trace_id=trace, span_id=span, scorer_id="s", score=0.5,
        span_name=f"agent{esc}", reason=f"because{esc}",
    )  # fmt: skip

    async def put() -> None:
        store = RedisScoreStore(url, sinks=["otlp"])
        await store.put_records([record], "w1", 600)
        await store.close()

    asyncio.run(put())
    _push_letters(url, DeadLetter(reason="retry_budget_exhausted", error=f"boom{esc}", run_ids=[f"run{esc}"]))
    outbox = RedisOutbox(url)
    try:
        lease = outbox.lease("otlp", 10, lease_s=30)
        letter = SinkDeadLetter(score_id=record.score_id, sink="otlp", reason="otlp_http_400", detail=f"no{esc}")
        assert outbox.dead(lease, [letter]) == 1
    finally:
        outbox.close()
    capsys.readouterr()
    for argv, shown in (
        (["scores", "--trace", trace], "because\ufffd]0;owned"),
        (["dlq", "list"], "boom\ufffd]0;owned"),
        (["dlq", "list"], "run\ufffd]0;owned"),
        (["sinks", "list"], "no\ufffd]0;owned"),
    ):
        assert main([*argv, "--broker", url]) == 0
        out = capsys.readouterr().out
        assert shown in out
        assert "\x1b" not in out
        assert "\x07" not in out
    assert main(["scores", "--trace", trace, "--broker", url]) == 0
    assert "agent\ufffd]0;owned" in capsys.readouterr().out


def test_worker_command_does_not_rewrite_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tracescore worker`'s options become its Settings; TRACESCORE_* are left as they were."""
    for var in ("TRACESCORE_SCORERS", "TRACESCORE_QUEUE", "TRACESCORE_MODEL_CONCURRENCY"):
        monkeypatch.delenv(var, raising=False)
    before = {k: v for k, v in os.environ.items() if k.startswith("TRACESCORE_")}
    argv = ["worker", "--scorers", "no_such_module_here", "--queue", "q2", "--model-concurrency", "3"]
    assert main([*argv, "--broker", NOWHERE]) == 1
    assert "cannot import scorer module 'no_such_module_here'" in capsys.readouterr().err
    assert {k: v for k, v in os.environ.items() if k.startswith("TRACESCORE_")} == before


def test_worker_command_takes_the_broker_flag_into_prefork_children(redis_url: str, tmp_path: Path) -> None:
    """`tracescore worker --broker URL --pool prefork` scores through that broker and store
    while TRACESCORE_BROKER_URL points nowhere: the settings reach the forked children."""
    scores = tmp_path / "scores.jsonl"
    log = tmp_path / "worker.log"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TRACESCORE_")},
        "TRACESCORE_BROKER_URL": NOWHERE,
        "TRACESCORE_WRITER": "jsonl",
        "TRACESCORE_WRITER_PATH": str(scores),
        "PYTHONPATH": str(ROOT),
    }
    cmd = [
        TRACESCORE,
        "worker", "--scorers", "tests.worker.sample_scorers", "--pool", "prefork", "--concurrency", "1",
        "--queue", "r4q", "--broker", redis_url,
    ]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert wait_for(lambda: " ready." in log.read_text() or proc.poll() is not None, 60), log.read_text()
        assert proc.poll() is None, log.read_text()
        sink = CelerySink(redis_url, queue="r4q")
        sink.send(batch(range(3), ["length"], salt="prefork-broker"))
        sink.close()
        assert wait_for(lambda: len(read_scores(scores)) >= 3, 30), log.read_text()[-2000:]
        assert redis_url.split("@")[0].rpartition(":")[2] not in log.read_text()  # the password never
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis://:sekrit@127.0.0.1:1/0?password=sekrit", "carries the password as a query parameter"),
        ("redis://:sekrit@127.0.0.1:1/?db=x", "query the Redis client cannot read: Invalid value for 'db'"),
        ("redis://:sekrit@127.0.0.1:1/0?socket_timeout=soon", "Invalid value for 'socket_timeout'"),
        ("redis://:sekrit@127.0.0.1:1/zero", "names database 'zero'"),
        ("amqp://guest:sekrit@127.0.0.1//", "is not a Redis URL"),
        # A slash or colon mistyped: no "://" for the masking to find, and the password went out
        ("redis:/:sekrit@127.0.0.1:1/0", "redis:/:***@127.0.0.1:1/0 is not a Redis URL"),
        ("redis//:sekrit@127.0.0.1:1/0", "redis//:***@127.0.0.1:1/0 is not a Redis URL"),
        ("redis:sekrit@127.0.0.1:1/0", "redis:***@127.0.0.1:1/0 is not a Redis URL"),
        # A parameter redis-py reads and kombu's Connection does not: the worker's start and
        # status's ping ended in "TypeError: Connection._init_params() got an unexpected keyword"
        ("redis://:sekrit@127.0.0.1:1/0?socket_timeout=5", "query parameter the broker's client (kombu)"),
        ("redis://:sekrit@127.0.0.1:1/0?db=1", "cannot take: 'db'"),
        # Pasted with a space: 'is not a Redis URL' (the space unseen), the URL shown as ' redis:***@'
        (" redis://:sekrit@127.0.0.1:1/0", " redis://:***@127.0.0.1:1/0 starts or ends with a space"),
        ("redis://:sekrit@127.0.0.1:1/0 ", "redis://:***@127.0.0.1:1/0  starts or ends with a space"),
    ],
)
def test_a_bad_broker_flag_is_a_usage_error_named_as_the_flag(
    url: str, problem: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --broker URL the settings refuse is a bad option value (the README's exit 2) naming
    --broker, its password masked. It was exit 1, and a query value redis-py cannot read
    (?db=x) was an unexpected-error line ("ValueError: Invalid value for 'db'")."""
    monkeypatch.delenv("TRACESCORE_BROKER_URL", raising=False)
    assert main(["status", "--broker", url]) == 2
    err = capsys.readouterr().err
    assert "Invalid value for --broker" in err
    assert problem in err, err
    assert "sekrit" not in err


def test_a_bad_broker_variable_is_named_as_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """From the environment it is a settings error (exit 1) naming the variable."""
    monkeypatch.setenv("TRACESCORE_BROKER_URL", "redis://:sekrit@127.0.0.1:1/?db=x")
    assert main(["status"]) == 1
    err = capsys.readouterr().err
    assert "TRACESCORE_BROKER_URL (redis://:***@127.0.0.1:1/?db=x) has a query the Redis client" in err, err
    assert "sekrit" not in err


@pytest.mark.parametrize("variable", ["TRACESCORE_BROKER_URL", "TRACESCORE_REDIS_URL"])
def test_a_mistyped_url_variable_is_named_without_its_password(
    variable: str, redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A slash short after the scheme: the broker's line printed the password whole (no "://"
    for the masking to find), and the store's was redis-py's "ValueError: Redis URL must
    specify one of the following schemes", naming no variable."""
    monkeypatch.setenv("TRACESCORE_BROKER_URL", redis_url)
    monkeypatch.setenv(variable, "redis:/:sekrit@127.0.0.1:1/0")
    assert main(["status"]) == 1
    err = capsys.readouterr().err
    assert f"{variable} (redis:/:***@127.0.0.1:1/0) is not a Redis URL" in err, err
    assert "sekrit" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["scores", "--trace", "ab" * 16],
        ["dlq", "list"],
        ["dlq", "retry", "--all"],
        ["sinks", "list"],
        ["worker", "--scorers", "tests.worker.sample_scorers"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_an_empty_broker_url_is_named_by_every_redis_command(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty TRACESCORE_BROKER_URL means embedded mode (backfill, score): a command that talks
    to Redis says what to set, not the Redis client's "must specify one of the following
    schemes"; the worker did not even fail, it served Celery's default AMQP broker, unscreened."""
    monkeypatch.setenv("TRACESCORE_BROKER_URL", "")
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "TRACESCORE_BROKER_URL is empty" in err
    assert "--broker redis://HOST:6379/0" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["scores", "--trace", "ab" * 16],
        ["dlq", "list"],
        ["sinks", "list"],
        ["worker", "--scorers", "tests.worker.sample_scorers"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_an_empty_broker_flag_is_no_broker_not_the_default_one(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--broker "" was ignored: the command went on to the variable or the default Redis on
    127.0.0.1:6379 (a worker started consuming there). It is no broker, named as the flag."""
    monkeypatch.setenv("TRACESCORE_BROKER_URL", "redis://:pw@127.0.0.1:1/0")
    assert main([*argv, "--broker", ""]) == 1
    err = capsys.readouterr().err
    assert "--broker is empty and this command talks to Redis" in err


def test_backfill_with_an_empty_broker_flag_scores_in_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """For backfill, --broker "" is embedded mode, as an empty variable is (the variable here
    names a Redis that is not there: it was used before)."""
    monkeypatch.setenv("TRACESCORE_BROKER_URL", "redis://:pw@127.0.0.1:1/0")
    examples = str(ROOT / "examples" / "traces" / "traces-000.jsonl.gz")
    argv = ["backfill", examples, "--scorers", "examples.scorers", "--scorer", "question-overlap", "--broker", ""]
    assert main(argv) == 0
    assert "embedded mode" in capsys.readouterr().err


def test_a_bad_broker_url_is_named_by_where_backfill_took_it_from(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """backfill blamed TRACESCORE_BROKER_URL for a bad --broker value."""
    examples = str(ROOT / "examples" / "traces")
    bad = "redis://127.0.0.1:1/0?password=sekrit"
    monkeypatch.delenv("TRACESCORE_BROKER_URL", raising=False)
    assert main(["backfill", examples, "--scorers", "examples.scorers", "--broker", bad]) == 2
    assert "--broker: redis://127.0.0.1:1/0?password=*** carries the password" in capsys.readouterr().err
    monkeypatch.setenv("TRACESCORE_BROKER_URL", bad)
    assert main(["backfill", examples, "--scorers", "examples.scorers"]) == 1
    assert "TRACESCORE_BROKER_URL (redis://127.0.0.1:1/0?password=***) carries" in capsys.readouterr().err


def test_celery_worker_with_an_empty_broker_url_refuses_to_start() -> None:
    """`celery -A worker worker` with an empty broker URL exits 1 saying so, instead of
    falling back to an AMQP broker on localhost where no message is screened."""
    done = failed_start("")
    assert done.returncode == 1, done.stderr[-2000:]
    assert "tracescore worker cannot start: TRACESCORE_BROKER_URL is empty" in done.stderr


def test_a_backfill_names_the_score_store_when_that_is_the_redis_refusing(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """TRACESCORE_REDIS_URL wrong, the broker right: backfill said the broker refused the
    credentials, "fix them in --broker" (audit); status and scores named the store."""
    monkeypatch.setenv("TRACESCORE_REDIS_URL", f"redis://:wrong-pw9@127.0.0.1:{redis_server.port}/6")
    examples = "examples/traces/traces-000.jsonl.gz"
    assert main(["backfill", examples, "--scorers", "examples.scorers", "--broker", redis_server.url(5)]) == 1
    err = capsys.readouterr().err
    assert f"the score store at redis://:***@127.0.0.1:{redis_server.port}/6 refused the URL's credentials" in err
    assert "TRACESCORE_REDIS_URL" in err
    assert "wrong-pw9" not in err


def test_the_password_hint_shows_the_users_form_without_the_user() -> None:
    """User-info without a password: the hint shows the form with a user, never the user-info
    itself, which is as often a password whose colon was forgotten (audit: it was echoed)."""
    from redis.exceptions import AuthenticationError

    from worker.cli import unreachable

    line = unreachable(
        "broker", "redis://s3cretPW@10.0.0.5:6379/0", AuthenticationError("Authentication required.")
    ).message
    assert line.endswith("(redis://USER:PASSWORD@host:6379/0)"), line
    assert "s3cretPW" not in line


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["scores", "--trace", "ab" * 16], "score store"),
        (["dlq", "list"], "score store"),
        (["dlq", "retry", "--all"], "score store"),
        (["status"], "broker"),
        (["sinks", "list"], "score store"),
        (["probe", "ready", "--dir", "{dir}"], "broker"),
        (["backfill", "examples/traces/traces-000.jsonl.gz", "--scorers", "examples.scorers"], "broker"),
        (["backfill", "--resume", "bf-0123", "--scorers", "examples.scorers"], "score store"),
    ],
    ids=["scores", "dlq-list", "dlq-retry", "status", "sinks", "probe-ready", "backfill", "backfill-resume"],
)
def test_a_refused_password_is_named_not_a_timeout(
    argv: list[str], what: str, redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No password, or a wrong one, for a Redis that asks one: named as such, with where the
    URL is set, the wrong password masked. It was 'Redis is unreachable ... (TimeoutError: )'
    after retrying what no retry fixes, and ``status``, ``sinks``, ``probe ready`` and
    ``backfill`` printed Redis's own NOAUTH text ("HELLO must be called with the client
    already authenticated ...")."""
    (tmp_path / READY_FILE).touch()
    argv = [a.replace("{dir}", str(tmp_path)) for a in argv]
    none = f"redis://127.0.0.1:{redis_server.port}/5"
    assert main([*argv, "--broker", none]) == 1
    err = capsys.readouterr().err
    assert f"the {what} at {none} asks for a password and the URL gives none" in err, err
    assert "--broker or TRACESCORE_BROKER_URL" in err
    assert "HELLO" not in err
    wrong = f"redis://:wrong-pw9@127.0.0.1:{redis_server.port}/5"
    assert main([*argv, "--broker", wrong]) == 1
    err = capsys.readouterr().err
    assert f"the {what} at redis://:***@127.0.0.1:{redis_server.port}/5 refused the URL's credentials" in err, err
    assert "wrong-pw9" not in err


@pytest.mark.parametrize("argv", [["sinks", "list"], ["sinks", "retry", "otlp", "--all"]])
def test_sinks_on_a_paused_redis_answer_as_status_does(argv: list[str], private_redis: RedisServer) -> None:
    """A Redis that stopped answering (SIGSTOP: a hung host, a long fork): `sinks list` and
    `sinks retry` retried calls of 10 s each for 52 s before saying so (audit); `status` says so
    in 2.5 s. They ask as `status` does now: 2 s a call, one retry (a deadline of 25 s here)."""
    RedisOutbox(private_redis.url(0)).register(["otlp"])
    assert private_redis.proc is not None
    private_redis.proc.send_signal(signal.SIGSTOP)
    try:
        done = run_tracescore(*argv, "--broker", private_redis.url(0), env={**os.environ}, timeout=25)
    finally:
        private_redis.proc.send_signal(signal.SIGCONT)
    assert done.returncode == 1, done.stderr
    assert f"cannot reach the score store at {redact(private_redis.url(0))}" in done.stderr
    assert private_redis.password not in done.stderr


def test_status_and_sinks_text_write_counts_with_thousands_separators(
    wrong_env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`status` and `sinks list|retry|drop` printed 123456 where `score`, `backfill` and `compare`
    print 123,456. Their text now groups thousands as the others do; --json keeps plain numbers."""
    import time

    from worker.backfill._state import BackfillOptions, BackfillState, RedisJobStore
    from worker.store._jobs import failure_bucket

    url = wrong_env
    _store_records_for_sink(url, _sink_records(2300))  # 2,300 pending for otlp
    outbox = RedisOutbox(url, max_dead_letters=5000)
    try:
        lease = outbox.lease("otlp", 1100, lease_s=30)
        dead = [SinkDeadLetter(score_id=i, sink="otlp", reason="http_403") for i in lease.attempts]
        assert outbox.dead(lease, dead) == 1100
    finally:
        outbox.close()
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        client.hset(_keys.outbox_counts_key("otlp"), mapping={"delivered": 123456, "dropped": 4321})
        client.hset(_keys.outbox_counts_key("otlp"), mapping={"dead_letters_dropped": 1500})
        client.rpush("tracescore", *["x"] * 1500)
        client.hset("unacked", mapping={f"t{n}": "x" for n in range(1200)})
        client.hset(_keys.dlq_reasons_key(), mapping={"not_json": 1001})
        client.hset(_keys.dlq_dropped_key(), mapping={"bad_headers": 2002})
        client.hset(_keys.failures_key(failure_bucket()), mapping={"timeout": 3003})
        client.hset(_keys.limiter_granted_key("m"), mapping={str(int(client.time()[0]) - 2): 1500})
        state = BackfillState(
            job_id="bf-big",
            created_at=time.time(),
            source={"kind": "files", "paths": ["/data"]},
            source_label="/data",
            options=BackfillOptions(scorers_module="tests.backfill.scorers", scorer_ids=["length"]),
        )
        state.counters.runs_enqueued = 5000
        assert RedisJobStore(client).save(state)
        client.hset(_keys.job_key("bf-big"), mapping={"scored": 4000, "failed": 1000, "skipped": 0})
    finally:
        client.close()
    capsys.readouterr()
    assert main(["status", "--json", "--timeout", "0.3", "--broker", url]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["queue_depth"], status["unacked"], status["sinks"]["otlp"]["delivered"]) == (1500, 1200, 123456)
    assert main(["status", "--timeout", "0.3", "--broker", url]) == 0
    text = capsys.readouterr().out
    assert "queue depth 1,500 waiting, 1,200 in progress (unacked)" in text
    assert "rate limit  m: calls_last_60s=1,500" in text
    assert "failures    last hour: timeout=3,003" in text
    assert "dead letters 0 (not_json=1,001)" in text  # (the list itself is empty here)
    assert f"of the bound's {status['dead_letters_max_bytes']:,} (TRACESCORE_DLQ_MAX_BYTES)" in text
    assert "the oldest first: bad_headers=2,002" in text
    sink = "otlp: 123,456 delivered, 1,200 pending, 1,100 failed, 4,321 dropped (record expired), 1,500 dead letters"
    assert f"sink        {sink}" in text
    assert "5,000 runs enqueued, 5,000 scores expected: 4,000 scored, 1,000 failed, 0 skipped" in text
    assert main(["sinks", "list", "otlp", "--limit", "1", "--broker", url]) == 0
    assert "otlp: 123,456 delivered, 1,200 pending, 1,100 failed, 1,500 dead letters" in capsys.readouterr().out
    assert main(["sinks", "list", "otlp", "--limit", "1", "--json", "--broker", url]) == 0
    assert json.loads(capsys.readouterr().out)["otlp"]["delivered"] == 123456
    assert main(["sinks", "retry", "otlp", "--all", "--broker", url]) == 0
    assert "1,100 score(s) queued again for otlp" in capsys.readouterr().out
    outbox = RedisOutbox(url, max_dead_letters=5000)
    try:
        lease = outbox.lease("otlp", 2300, lease_s=30)
        dead = [SinkDeadLetter(score_id=i, sink="otlp", reason="http_403") for i in lease.attempts]
        assert outbox.dead(lease, dead) == 2300
    finally:
        outbox.close()
    assert main(["sinks", "drop", "otlp", "--all", "--yes", "--broker", url]) == 0
    assert "2,300 dropped, 0 not" in capsys.readouterr().err
