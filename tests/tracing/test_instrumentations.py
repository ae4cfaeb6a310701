"""trace_to_run and the exporter on spans made by real instrumentations of the openai SDK.

Each instrumentation runs in its own subprocess (they patch ``openai`` globally and read their
settings once), against the session's fake LLM server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scorers.agent import ScorerRunInputForAgent, ScorerRunOutputForAgent
from tests.fakellm._script import Reply
from tests.fakellm._server import FakeLLMServer
from tests.tracing._exporting import read
from tracing import ScoreBatch, TraceReadError

ROOT = Path(__file__).resolve().parents[2]


def _run_app(mode: str, fake_llm: FakeLLMServer, env: dict[str, str]) -> dict[str, Any]:
    fake_llm.script(Reply.text("Let me look that up."), Reply.text("Order 42 has shipped."))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.tracing._instrumented_app", mode],
        cwd=ROOT,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert fake_llm.count() == 2
    return out


def _check_run(out: dict[str, Any]) -> None:
    run = out["run"]
    inp = ScorerRunInputForAgent.model_validate(run["input"])
    output = ScorerRunOutputForAgent.validate(run["output"])
    assert [m.text for m in inp.input_messages] == ["Where is order 42?"]
    assert [m.text for m in inp.remembered_messages] == ["Hi, I'm Ann.", "Hello Ann! How can I help?"]
    assert [m.text for m in inp.system_messages] == ["You are the support agent of a shop."]
    assert output.text == "Let me look that up.\nOrder 42 has shipped."
    # The fake model asks for no tool, but the agent ran one (its span): it is in the first step.
    (inv,) = output[0].tool_invocations
    assert (inv.tool_name, inv.tool_call_id, inv.result) == ("order_status", "call_42", "shipped")
    assert inv.args == {"order": 42}
    assert run["identity"]["agent_name"] == "support"
    assert run["identity"]["conversation_id"] == "conv-1"
    assert run["identity"]["model"] == "gpt-4o-mini"
    assert run["identity"]["service_name"] == "shop-support"
    # The exporter, behind a span processor, sent the spans; read on the worker, the same run.
    assert out["stats"]["runs_sent"] == 1
    (request,) = ScoreBatch.model_validate(out["sent"][0]).requests
    assert read(request).model_dump(mode="json") == run


@pytest.mark.parametrize("mode", ["otel-latest", "openinference"])
def test_instrumented_agent_turn(mode: str, fake_llm: FakeLLMServer, fake_llm_env: dict[str, str]) -> None:
    """Spans from the real instrumentation read into the right input, history, system and output."""
    out = _run_app(mode, fake_llm, fake_llm_env)
    assert len(out["spans"]) == 4  # agent, 2 LLM calls, tool
    if mode == "otel-latest":  # latest GenAI conventions: content on span attributes, no log events
        assert out["log_events"] == 0
        assert "opentelemetry.util.genai.handler" in {s["scope"] for s in out["spans"]}
    _check_run(out)


def test_otel_legacy_log_events(fake_llm: FakeLLMServer, fake_llm_env: dict[str, str]) -> None:
    """The legacy (v1.30) path emits per-message log events; trace_to_run reads them as events."""
    out = _run_app("otel-legacy", fake_llm, fake_llm_env)
    assert out["log_events"] >= 6
    run = out["run"]
    inp = ScorerRunInputForAgent.model_validate(run["input"])
    assert [m.text for m in inp.input_messages] == ["Where is order 42?"]
    assert [m.text for m in inp.system_messages] == ["You are the support agent of a shop."]
    assert ScorerRunOutputForAgent.validate(run["output"]).text == "Let me look that up.\nOrder 42 has shipped."
    # Spans alone carry no content here (it went to log records): the worker cannot read the
    # shipped trace and says why.
    (request,) = ScoreBatch.model_validate(out["sent"][0]).requests
    with pytest.raises(TraceReadError) as err:
        read(request)
    assert err.value.reason == "no_content"
