"""README "Backfill": a trace whose span parent ids form a cycle is unreadable (`parent_cycle`),
counted and reported, in process and through a broker alike; the other traces are scored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests._redis import RedisServer
from tests.backfill._synth import write_otlp_files
from worker.cli import cli

CYCLE = "ab" * 16


def _span(span_id: str, parent: str, name: str, operation: str) -> dict[str, Any]:
    attributes = [{"key": "gen_ai.operation.name", "value": {"stringValue": operation}}]
    return {"traceId": CYCLE, "spanId": span_id, "parentSpanId": parent, "name": name,
            "startTimeUnixNano": "1000", "endTimeUnixNano": "2000", "attributes": attributes}  # fmt: skip


@pytest.mark.parametrize("mode", ["embedded", "redis"])
def test_a_trace_whose_parents_form_a_cycle_is_counted_and_named(
    tmp_path: Path, mode: str, request: pytest.FixtureRequest
) -> None:
    write_otlp_files(tmp_path, 3, files=1, compress=False)
    spans = [_span("11" * 8, "22" * 8, "agent", "invoke_agent"), _span("22" * 8, "11" * 8, "chat", "chat")]
    (tmp_path / "cycle.jsonl").write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}) + "\n")
    args = ["backfill", str(tmp_path), "--scorers", "tests.backfill.scorers", "--json"]
    if mode == "redis":
        server: RedisServer = request.getfixturevalue("private_redis")
        args += ["--broker", server.url(0), "--no-wait"]
    result = CliRunner().invoke(cli, args, env={"TRACESCORE_BROKER_URL": ""})
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["traces_unreadable"] == {"parent_cycle": 1}, summary
    assert (summary["traces_read"], summary["runs_enqueued"] if mode == "redis" else 3) == (4, 3), summary
    assert f"trace {CYCLE}: not scored (parent_cycle)" in result.stderr
