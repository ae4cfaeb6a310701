"""What the Phoenix sink sends must be what Phoenix stores on PostgreSQL too, not only on the
SQLite of tests/integration. Phoenix's REST models check no length (server/api/routers/v1/
annotations.py, SpanAnnotationData); its database does, and Phoenix answers the database's error
as HTTP 500 for the whole request, which upserts every annotation of a batch in one transaction:
one such record made its whole batch (up to 100 scores) a Retry, until each was a dead letter.

Seen by hand against ``phoenix serve`` (arize-phoenix 20.26) on PostgreSQL 15 (asyncpg): a NUL
in a reason, a label, a scorer id, an error message ("invalid byte sequence for encoding UTF8:
0x00") or a metadata value ("unsupported Unicode escape sequence": JSONB) → 500; a scorer id of
4,000 random characters → 500 ("index row size 4096 exceeds btree version 4 maximum 2704 for index
uq_span_annotations_name_span_rowid_identifier"). A 3 MB reason or label was stored (text, not
indexed). ``_phoenix()`` below refuses as that server did.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests._http import QuietHandler, serving
from tracing import ScoreRecord, score_id_for
from tracing.sinks import Delivered, PhoenixSink

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"

# PostgreSQL's B-tree index entry limit (a third of an 8 KiB page): phoenix/db/models.py,
# SpanAnnotation's UniqueConstraint("name", "span_rowid", "identifier"). Counted here as the
# uncompressed bytes of name and identifier, the span's bigint and a tuple's headers (an
# incompressible name is what reaches it).
_BTREE_MAX_BYTES = 2704
_INDEX_OVERHEAD_BYTES = 8 + 24


class _ServerError(Exception):
    pass


def _check(annotation: dict[str, Any]) -> None:
    """Refuse ``annotation`` as Phoenix on PostgreSQL did (models.py SpanAnnotation)."""
    result = annotation.get("result") or {}
    for text in (annotation["name"], annotation["identifier"], result.get("label"), result.get("explanation")):
        if "\x00" in (text or ""):  # VARCHAR columns: PostgreSQL's text holds no NUL
            raise _ServerError('invalid byte sequence for encoding "UTF8": 0x00')
    if "\\u0000" in json.dumps(annotation.get("metadata") or {}):  # JSONB holds no \u0000
        raise _ServerError("unsupported Unicode escape sequence")
    row = len(annotation["name"].encode()) + len(annotation["identifier"].encode()) + _INDEX_OVERHEAD_BYTES
    if row > _BTREE_MAX_BYTES:
        raise _ServerError(f"index row size {row} exceeds btree version 4 maximum {_BTREE_MAX_BYTES}")


@contextmanager
def _phoenix() -> Iterator[tuple[str, dict[str, dict[str, Any]]]]:
    """A fake ``POST /v1/span_annotations?sync=true`` on PostgreSQL: the batch is one
    transaction (any annotation refused → HTTP 500, none stored); yields its URL and what it
    stored, by identifier."""
    stored: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            data = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))["data"]
            try:
                for annotation in data:
                    _check(annotation)
            except _ServerError:
                status, body = 500, b"Internal Server Error"
            else:
                with lock:
                    stored.update({a["identifier"]: a for a in data})
                status, body = 200, json.dumps({"data": [{"id": str(i)} for i in range(len(data))]}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if status == 200 else "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with serving(Handler) as url:
        yield url, stored


def _record(n: int, scorer_id: str = "s", **fields: Any) -> ScoreRecord:
    span = f"{n + 1:016x}"
    return ScoreRecord(
        score_id=score_id_for(TRACE, span, scorer_id, "1"), trace_id=TRACE, span_id=span, scorer_id=scorer_id,
        **fields,
    )  # fmt: skip


_RANDOM = secrets.token_urlsafe(3000)  # 4,000 characters nothing compresses
_CASES: dict[str, dict[str, Any]] = {
    "plain": {"score": 0.5, "reason": "fine"},
    "nul_reason": {"score": 0.5, "reason": "a\x00b"},
    "nul_label": {"score": 0.5, "label": "x\x00y"},
    "nul_scorer_id": {"scorer_id": "nul\x00scorer", "score": 0.5},
    "nul_error": {"error_type": "JudgeError", "error_message": "boom \x00"},
    "nul_environment": {"score": 0.5, "environment": "prod\x00"},
    "long_scorer_id": {"scorer_id": "s-" + _RANDOM, "score": 0.5},
    "long_scorer_id_twin": {"scorer_id": "s-" + _RANDOM + "-2", "score": 0.5},
    "huge_reason": {"score": 0.5, "reason": "r" * 3_000_000},
}


def test_what_a_postgres_backed_phoenix_refuses_is_sent_as_it_stores_it() -> None:
    """One batch: at HEAD every record of it was a Retry (HTTP 500), the plain one too; now each
    is stored, NUL as U+FFFD, a name over the index's room cut with a marker saying so."""
    records = [_record(n, **fields) for n, fields in enumerate(_CASES.values())]
    with _phoenix() as (url, stored):
        sink = PhoenixSink(url, timeout_s=10)
        try:
            outcomes = sink.deliver(records)
        finally:
            sink.close()
    assert dict(zip(_CASES, outcomes, strict=True)) == dict.fromkeys(_CASES, Delivered())
    rows = {case: stored[f"tracescore:{r.score_id}"] for case, r in zip(_CASES, records, strict=True)}
    assert rows["nul_reason"]["result"]["explanation"] == "a\ufffdb"
    assert rows["nul_label"]["result"]["label"] == "x\ufffdy"
    assert rows["nul_scorer_id"]["name"] == "nul\ufffdscorer"
    assert rows["nul_scorer_id"]["metadata"]["scorer_id"] == "nul\ufffdscorer"
    assert rows["nul_error"]["result"]["explanation"] == "JudgeError: boom \ufffd"
    assert rows["nul_environment"]["metadata"]["environment"] == "prod\ufffd"
    name = rows["long_scorer_id"]["name"]
    assert name.startswith("s-" + _RANDOM[:1500])
    assert "cut by tracescore from 4,002 characters" in name
    assert rows["long_scorer_id_twin"]["name"] != name  # two scorers stay two names
    # (not indexed: PostgreSQL's text holds it whole, as SQLite does)
    assert rows["huge_reason"]["result"]["explanation"] == "r" * 3_000_000
    assert rows["plain"]["name"] == "s"
