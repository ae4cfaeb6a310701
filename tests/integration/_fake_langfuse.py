"""A local stand-in for Langfuse's score API (Langfuse's own server cannot run here).

``FakeLangfuse`` serves ``POST /api/public/scores`` on a free loopback port (stdlib
``http.server`` in a thread) and checks each create request the way Langfuse's public API
definition says (``CreateScoreRequest`` in ``fern/apis/server/definition/scores.yml``):

- HTTP Basic auth with the project's public key as user and secret key as password, else 401;
- a JSON object; ``name`` a non-empty string; ``value`` a number or a string; one of
  ``traceId`` / ``sessionId`` / ``datasetRunId``; ``observationId`` only with ``traceId``;
  optional fields of their declared types; no field the definition does not have (stricter
  than Langfuse, so a misspelt field fails here instead of being dropped there);
- ``dataType`` (NUMERIC when absent, as Langfuse defaults): NUMERIC a finite number,
  BOOLEAN 0 or 1, CATEGORICAL a string, TEXT a string of 1-500 characters.

Scores are kept by ``id`` (a new one when absent). A create with a known id is merged into that
score as Langfuse's ingestion merges it (``overwriteObject`` in its worker's
``IngestionService/utils.ts``): a field left out keeps its old value, a null replaces it, the
metadata objects are merged key by key, and the trace id and ``createdAt`` never change.
Metadata values are kept as text, as Langfuse stores them (``convertRecordValuesToString``).
A body over 1 MiB is answered 413 "Body exceeded 1mb limit" in plain text before any other
check, as Next.js answers it for Langfuse's score route (``web/src/pages/api/public/scores/
index.ts`` sets no body size, so Next.js's ``parseBody`` applies its default ``1mb``);
``largest_body`` is the largest body received. ``fail_next`` makes the next requests answer an
error status (503, 429 with Retry-After) before any check, as an overloaded server would;
``suspended`` answers every request with Langfuse Cloud's 403 for a project past its usage
threshold.
"""

from __future__ import annotations

import base64
import json
import math
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SCORES_PATH = "/api/public/scores"
# Next.js's default body size for an API route ("1mb", by the bytes package: 1 MiB).
BODY_LIMIT = 2**20
_DATA_TYPES = frozenset({"NUMERIC", "CATEGORICAL", "BOOLEAN", "CORRECTION", "TEXT"})
_STRING_FIELDS = (
    "id", "traceId", "sessionId", "observationId", "datasetRunId", "comment", "environment", "queueId", "configId",
)  # fmt: skip
_FIELDS = frozenset({*_STRING_FIELDS, "name", "value", "metadata", "dataType", "source"})
_NULLABLE = frozenset({"comment", "metadata"})
_IMMUTABLE = ("id", "traceId", "environment", "createdAt")


def check_score(body: Any) -> list[str]:
    """What is wrong with a create-score body by Langfuse's definition ([] when nothing)."""
    if not isinstance(body, dict):
        return ["body: expected an object"]
    problems = [f"{key}: not a CreateScoreRequest field" for key in sorted(set(body) - _FIELDS)]
    name = body.get("name")
    if not isinstance(name, str) or not name:
        problems.append("name: required, a non-empty string")
    for key in _STRING_FIELDS:
        if key in body and not isinstance(body[key], str) and not (key in _NULLABLE and body[key] is None):
            problems.append(f"{key}: expected a string")
    if not any(isinstance(body.get(key), str) for key in ("traceId", "sessionId", "datasetRunId")):
        problems.append("traceId: one of traceId, sessionId or datasetRunId is required")
    if "observationId" in body and "traceId" not in body:
        problems.append("observationId: only with traceId")
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        problems.append("metadata: expected an object")
    if "source" in body and body["source"] not in ("API", "ANNOTATION"):
        problems.append("source: expected API or ANNOTATION")
    data_type = body.get("dataType", "NUMERIC")
    if data_type not in _DATA_TYPES:
        problems.append(f"dataType: expected one of {', '.join(sorted(_DATA_TYPES))}")
    if "value" not in body:
        problems.append("value: required")
        return problems
    value = body["value"]
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if data_type == "NUMERIC" and not (number and math.isfinite(value)):
        problems.append("value: a NUMERIC score needs a finite number")
    elif data_type == "BOOLEAN" and not (number and value in (0, 1)):
        problems.append("value: a BOOLEAN score needs 0 or 1")
    elif data_type in ("CATEGORICAL", "CORRECTION") and not isinstance(value, str):
        problems.append(f"value: a {data_type} score needs a string")
    elif data_type == "TEXT" and not (isinstance(value, str) and 1 <= len(value) <= 500):
        problems.append("value: a TEXT score needs a string of 1-500 characters")
    return problems


@dataclass
class FakeLangfuse:
    """The fake server; ``scores`` by id, ``statuses`` counts every answer by HTTP status."""

    public_key: str = "pk-lf-test"
    secret_key: str = "sk-lf-test"
    scores: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    statuses: Counter[int] = field(default_factory=Counter, repr=False)
    suspended: bool = False
    largest_body: int = 0
    _failures: list[tuple[int, str | None]] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _server: ThreadingHTTPServer | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        assert self._server is not None, "FakeLangfuse is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeLangfuse:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-langfuse", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def fail_next(self, count: int, status: int = 503, *, retry_after: str | None = None) -> None:
        """The next ``count`` requests answer ``status`` (and Retry-After) without being read."""
        with self._lock:
            self._failures += [(status, retry_after)] * count

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    # The request handler's side, under the lock.

    def _answer(
        self, method: str, path: str, auth: str | None, raw: bytes
    ) -> tuple[int, dict[str, Any] | str, str | None]:
        with self._lock:
            self.largest_body = max(self.largest_body, len(raw))
            if self._failures:
                status, retry_after = self._failures.pop(0)
                return status, {"message": "Service temporarily unavailable", "error": "Unavailable"}, retry_after
            if len(raw) > BODY_LIMIT:
                return 413, "Body exceeded 1mb limit", None
            if not self._authorized(auth):
                message = "Invalid credentials. Confirm that you've configured the correct host."
                return 401, {"message": message, "error": "Unauthorized"}, None
            if self.suspended:
                message = "Ingestion suspended: Usage threshold exceeded. Please upgrade your plan."
                return 403, {"message": message, "error": "ForbiddenError"}, None
            if method != "POST" or path != SCORES_PATH:
                return 404, {"message": "Not found", "error": "NotFound"}, None
            try:
                body = json.loads(raw)
            except ValueError:
                return 400, {"message": "Invalid request data", "error": ["body: not JSON"]}, None
            problems = check_score(body)
            if problems:
                return 400, {"message": "Invalid request data", "error": problems}, None
            score_id = body.get("id") or str(uuid.uuid4())
            now = time.time()
            new = {**body, "id": score_id, "createdAt": now, "updatedAt": now}
            self.scores[score_id] = _merged(self.scores.get(score_id), new)
            return 200, {"id": score_id}, None

    def _authorized(self, header: str | None) -> bool:
        scheme, _, encoded = (header or "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        return user == self.public_key and password == self.secret_key


def _merged(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """``new`` merged into the score ``old`` as Langfuse's ingestion merges them."""
    if old is None:
        merged = dict(new)
    else:
        merged = {**old, **new}  # a key left out keeps its value; null is a value
        merged.update({key: old[key] for key in _IMMUTABLE if key in old})
        merged["metadata"] = {**(old.get("metadata") or {}), **(new.get("metadata") or {})}
    metadata = merged.get("metadata") or {}
    merged["metadata"] = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    return merged


def _handler(fake: FakeLangfuse) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            status, body, retry_after = fake._answer(method, self.path, self.headers.get("Authorization"), raw)
            with fake._lock:
                fake.statuses[status] += 1
            text = body if isinstance(body, str) else json.dumps(body)
            payload = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
            self.send_header("Content-Length", str(len(payload)))
            if retry_after is not None:
                self.send_header("Retry-After", retry_after)
            self.end_headers()
            self.wfile.write(payload)

        def do_POST(self) -> None:
            self._serve("POST")

        def log_message(self, format: str, *args: Any) -> None:  # quiet: pytest shows failures
            pass

    return Handler
