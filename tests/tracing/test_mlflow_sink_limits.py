"""What the MLflow sink sends must be what every database behind MLflow stores, not only the SQLite
of tests/integration. MLflow validates no assessment field itself (mlflow/utils/validation.py has
no assessment limit); its database does, and MLflow answers the database's error:

- a value too long or not storable → SQLAlchemy's DataError → ``ManagedSessionMaker``
  (mlflow/store/db/utils.py) raises BAD_REQUEST: HTTP 400, a dead letter at once;
- a NUL character in a plain text column → with psycopg2, its ValueError ("A string literal
  cannot contain NUL (0x00) characters"), which MLflow's handler answers as HTTP 500: retried
  until ``max_attempts``, then a dead letter; with psycopg 3, a DataError: 400.

Seen by hand against ``mlflow server`` (3.17.2) on PostgreSQL 15 (psycopg2, and psycopg 3) and
MariaDB 10.11 (pymysql, utf8mb4, strict mode): NUL in a reason, a scorer id or a not-scorable
reason → 500 (psycopg2) or 400 (psycopg 3); a scorer id of 251 characters → 400 on both; a
reason, a label, an error message or a not-scorable reason over 64 KiB → 400 on MariaDB.
``_mlflow()`` below refuses as they did; each check names the column and the MLflow source it
mirrors.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests._http import QuietHandler, serving
from tracing import ScoreRecord, score_id_for
from tracing.sinks import Delivered, MlflowSink

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"

# mlflow/store/tracking/dbmodels/models.py, SqlAssessments (migration 770bee3ae1dd): name and
# source_id are String(250): VARCHAR(250), which PostgreSQL and MySQL count in characters.
_VARCHAR_250 = 250
# value, error, rationale and assessment_metadata are sa.Text(): MySQL's TEXT holds 65,535
# bytes (MLflow widened other columns to MEDIUMTEXT for MySQL in later migrations, not these).
_MYSQL_TEXT_BYTES = 65_535


class _Refusal(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _columns(assessment: dict[str, Any]) -> dict[str, str | None]:
    """The row MLflow writes for a feedback assessment: SqlAssessments.from_mlflow_entity
    (models.py) stores value, error and metadata as ``json.dumps`` (ASCII, escaped), the name,
    source id and rationale as they are."""
    feedback = assessment.get("feedback") or {}
    error = feedback.get("error")
    metadata = assessment.get("metadata")
    return {
        "name": assessment.get("assessment_name"),
        "source_id": (assessment.get("source") or {}).get("source_id"),
        "rationale": assessment.get("rationale"),
        "value": json.dumps(feedback.get("value")),
        "error": json.dumps({"error_code": error.get("error_code"), "error_message": error.get("error_message"),
                             "stack_trace": None}) if error else None,
        "assessment_metadata": json.dumps(metadata) if metadata else None,
    }  # fmt: skip


def _check(row: dict[str, str | None]) -> None:
    """Refuse ``row`` as MLflow on PostgreSQL or on MySQL would (the first problem found)."""
    for column in ("name", "source_id", "rationale"):
        if "\x00" in (row[column] or ""):
            # PostgreSQL text refuses NUL; psycopg2 raises ValueError before the query is sent,
            # which is no SQLAlchemyError: MLflow's catch_mlflow_exception does not map it → 500.
            raise _Refusal(500, "INTERNAL_ERROR", "A string literal cannot contain NUL (0x00) characters.")
    for column in ("name", "source_id"):
        if len(row[column] or "") > _VARCHAR_250:
            raise _Refusal(400, "BAD_REQUEST", "value too long for type character varying(250)")
    for column in ("value", "error", "rationale", "assessment_metadata"):
        if len((row[column] or "").encode("utf-8")) > _MYSQL_TEXT_BYTES:
            raise _Refusal(400, "BAD_REQUEST", f"(1406, \"Data too long for column '{column}' at row 1\")")


@contextmanager
def _mlflow() -> Iterator[tuple[str, dict[str, dict[str, Any]]]]:
    """A fake MLflow assessments API whose database refuses as PostgreSQL and MySQL do: PATCH of
    an unknown id → RESOURCE_DOES_NOT_EXIST, POST creates. Yields its URL and what it stored."""
    stored: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()

    class Handler(QuietHandler):
        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _serve(self) -> None:
            sent = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))["assessment"]
            with lock:
                if self.command == "PATCH" and sent["assessment_id"] not in stored:
                    self._answer(404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "not found"})
                    return
                try:
                    _check(_columns(sent))
                except _Refusal as refusal:
                    self._answer(refusal.status, {"error_code": refusal.code, "message": refusal.message})
                    return
                stored[sent["assessment_id"]] = sent
            self._answer(200, {"assessment": sent})

        do_POST = do_PATCH = _serve

    with serving(Handler) as url:
        yield url, stored


def _record(n: int, scorer_id: str = "s", **fields: Any) -> ScoreRecord:
    span = f"{n + 1:016x}"
    return ScoreRecord(
        score_id=score_id_for(TRACE, span, scorer_id, "1"), trace_id=TRACE, span_id=span, scorer_id=scorer_id,
        **fields,
    )  # fmt: skip


_LONG_ID = "scorer-" + "é" * 3000
# Each was refused by the database behind MLflow (see the module docstring): never stored.
_CASES: dict[str, dict[str, Any]] = {
    "nul_reason": {"score": 0.5, "reason": "a\x00b"},
    "nul_scorer_id": {"scorer_id": "nul\x00scorer", "score": 0.5, "reason": "fine"},
    "nul_not_scorable": {"not_scorable": "no \x00 ground truth"},
    "long_scorer_id": {"scorer_id": _LONG_ID, "score": 0.5},
    "long_scorer_id_twin": {"scorer_id": _LONG_ID + "-2", "score": 0.5},
    "huge_reason": {"score": 0.5, "reason": "r" * 3_000_000},
    "wide_reason": {"score": 0.5, "reason": "é" * 40_000},  # 80,000 bytes of UTF-8
    "huge_label": {"label": "l" * 70_000},
    "escaped_label": {"label": "🙂" * 10_000},  # 40,000 bytes, but 120,002 once json.dumps escapes it
    "huge_error": {"error_type": "JudgeError", "error_message": "m" * 70_000},
    "huge_not_scorable": {"not_scorable": "n" * 70_000},
}


def _deliver(records: list[ScoreRecord]) -> tuple[list[Any], dict[str, dict[str, Any]]]:
    with _mlflow() as (url, stored):
        sink = MlflowSink(url, timeout_s=10, parallel=2)
        try:
            return sink.deliver(records), stored
        finally:
            sink.close()


def test_what_a_postgres_or_mysql_backed_mlflow_refuses_is_sent_as_it_stores_it() -> None:
    """Each was a 400 (a dead letter) or a 500 (retried, then a dead letter) from MLflow on
    PostgreSQL or MySQL: now every one is stored, NUL as U+FFFD, a text over its column cut with
    a marker saying so."""
    records = [_record(n, **fields) for n, fields in enumerate(_CASES.values())]
    outcomes, stored = _deliver(records)
    assert dict(zip(_CASES, outcomes, strict=True)) == dict.fromkeys(_CASES, Delivered())
    rows = {case: stored[f"a-{r.score_id[:32]}"] for case, r in zip(_CASES, records, strict=True)}
    for case, row in rows.items():
        text = json.dumps(row, ensure_ascii=False)
        assert "\\u0000" not in text, case
    assert rows["nul_reason"]["rationale"] == "a\ufffdb"
    assert rows["nul_scorer_id"]["assessment_name"] == "nul\ufffdscorer"
    assert rows["nul_scorer_id"]["source"]["source_id"] == "nul\ufffdscorer"
    long_name = rows["long_scorer_id"]["assessment_name"]
    assert len(long_name) <= _VARCHAR_250
    assert long_name.startswith(_LONG_ID[:150])
    assert "cut" in long_name
    assert rows["long_scorer_id"]["source"]["source_id"] == long_name
    # two scorers alike in their first 250 characters stay two names
    assert rows["long_scorer_id_twin"]["assessment_name"] != long_name
    for case in ("huge_reason", "wide_reason", "huge_not_scorable"):
        rationale = rows[case]["rationale"]
        assert len(rationale.encode()) <= _MYSQL_TEXT_BYTES, case
        assert "cut" in rationale[-80:], case
    assert rows["huge_reason"]["rationale"].startswith("r" * 60_000)
    assert rows["escaped_label"]["feedback"]["value"].startswith("🙂" * 5_000)
    assert "cut" in rows["huge_label"]["feedback"]["value"][-80:]
    assert "cut" in rows["huge_error"]["feedback"]["error"]["error_message"][-80:]


@pytest.mark.parametrize(
    "fields",
    [
        {"score": 0.5, "reason": "r" * 60_000, "label": "l" * 4_000},
        {"scorer_id": "s" * 250, "score": 1.0, "reason": "Ответ ✓ 答案 🙂"},
        {"error_type": "JudgeError", "error_message": "boom"},
    ],
)
def test_what_every_backend_stores_is_sent_unchanged(fields: dict[str, Any]) -> None:
    """(No cut and no marker where the columns hold the text whole.)"""
    record = _record(0, **fields)
    outcomes, stored = _deliver([record])
    assert outcomes == [Delivered()]
    row = stored[f"a-{record.score_id[:32]}"]
    assert row["assessment_name"] == record.scorer_id
    assert row["rationale"] == (record.reason or "")
    if record.label is not None:
        assert row["metadata"]["label"] == record.label
    if record.error_message is not None:
        assert row["feedback"]["error"]["error_message"] == record.error_message
