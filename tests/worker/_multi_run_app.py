"""An application whose traces hold several agent runs, exported live through the real
``ScoringSpanExporter`` behind a real ``BatchSpanProcessor``, and a ``CelerySink`` that remembers
which requests Redis acknowledged (tests/worker/test_multi_run_faults.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from tests.tracing._spans import genai_messages
from tracing import CelerySink, ScoreBatch, ScoringSpanExporter

__all__ = ["AckedSink", "MultiRunApp", "Phase", "Run", "Traffic"]


class AckedSink:
    """A ``CelerySink`` that records every request whose publish returned: Redis acknowledged
    the message (the exporter's sender treats exactly these as sent). A publish that raised may
    still have reached Redis before its connection broke: the exporter retries it, so such a run
    is recorded on the retry that returns, and the worker's score ids make the copy add nothing.

    It is an ``EncodedSink`` like the sink it wraps (``max_payload_bytes`` and ``send_encoded``),
    so the exporter cuts and encodes messages exactly as it does for a bare ``CelerySink``."""

    def __init__(self, sink: CelerySink) -> None:
        self._sink = sink
        self.max_payload_bytes = sink.max_payload_bytes
        self._lock = threading.Lock()
        # (trace id, target span ids) of each acknowledged request, in the order sent.
        self.requests: list[tuple[str, tuple[str, ...]]] = []

    def _acked(self, batch: ScoreBatch) -> None:
        with self._lock:
            self.requests.extend((r.trace_id, tuple(r.target_span_ids)) for r in batch.requests)

    def send(self, batch: ScoreBatch) -> None:
        self._sink.send(batch)
        self._acked(batch)

    def send_encoded(self, batch: ScoreBatch, requests_json: Sequence[str]) -> None:
        self._sink.send_encoded(batch, requests_json)
        self._acked(batch)

    def close(self) -> None:
        self._sink.close()

    def acked(self) -> list[tuple[str, tuple[str, ...]]]:
        with self._lock:
            return list(self.requests)


@dataclass(frozen=True, slots=True)
class Run:
    """One agent run of a trace: what its score records must say."""

    trace_id: str
    span_id: str
    span_name: str
    length: float  # the ``length`` (and ``slow``) scorer's score of its answer


@dataclass(frozen=True, slots=True)
class Phase:
    """``traces`` traces, ``pause_s`` apart (0: a flood)."""

    name: str
    traces: int
    pause_s: float = 0.0


@dataclass
class _Made:
    traces: int = 0
    spans: int = 0
    runs: list[Run] = field(default_factory=list)


class MultiRunApp:
    """A tracer provider with the exporter behind a ``BatchSpanProcessor`` (its queue large
    enough that the processor itself never drops a span: what is lost must be the exporter's
    to count). Trace ``i`` is a workflow span over ``2 + i % 2`` agent runs, each an agent span
    with a chat span holding GenAI messages; run ``k``'s answer is ``10 * (k + 1)`` characters."""

    def __init__(self, exporter: ScoringSpanExporter, *, schedule_delay_s: float = 0.1) -> None:
        self.exporter = exporter
        self.provider = TracerProvider(resource=Resource.create({"service.name": "multi-run-app"}))
        self.provider.add_span_processor(
            BatchSpanProcessor(exporter, schedule_delay_millis=schedule_delay_s * 1000, max_queue_size=65_536)
        )
        self.tracer = self.provider.get_tracer("multi.run.app")
        self._lock = threading.Lock()
        self._made = _Made()

    def workflow(self, i: int) -> None:
        runs: list[Run] = []
        with self.tracer.start_as_current_span("workflow", attributes={"http.route": "/task"}) as root:
            trace_id = format(root.get_span_context().trace_id, "032x")
            for k in range(2 + i % 2):
                name = f"invoke_agent a{k}"
                attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": f"a{k}"}
                with self.tracer.start_as_current_span(name, attributes=attrs) as agent:
                    chat = {
                        "gen_ai.operation.name": "chat",
                        "gen_ai.input.messages": genai_messages(("user", f"question {i}.{k}")),
                        "gen_ai.output.messages": genai_messages(("assistant", "y" * 10 * (k + 1))),
                    }
                    with self.tracer.start_as_current_span("chat m", attributes=chat):
                        pass
                span_id = format(agent.get_span_context().span_id, "016x")
                runs.append(Run(trace_id, span_id, name, round(0.1 * (k + 1), 6)))
        with self._lock:
            self._made.traces += 1
            self._made.spans += 1 + 2 * len(runs)
            self._made.runs.extend(runs)

    @property
    def traces(self) -> int:
        with self._lock:
            return self._made.traces

    @property
    def spans(self) -> int:
        with self._lock:
            return self._made.spans

    @property
    def runs(self) -> list[Run]:
        with self._lock:
            return list(self._made.runs)

    def shutdown(self) -> None:
        self.provider.shutdown()


class Traffic(threading.Thread):
    """Plays ``phases`` on ``app`` in one thread (as an application's request handlers would).

    After ``checkpoint`` traces it sets ``at_checkpoint`` and waits for ``resume`` (the test
    kills Redis there: a fault at a known point of a flood, not wherever a poll happens to land)."""

    def __init__(self, app: MultiRunApp, phases: Sequence[Phase], *, checkpoint: int | None = None) -> None:
        super().__init__(name="multi-run-traffic", daemon=True)
        self.app, self.phases, self.checkpoint = app, list(phases), checkpoint
        self.at_checkpoint = threading.Event()
        self.resume = threading.Event()
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        i = 0
        try:
            for phase in self.phases:
                for _ in range(phase.traces):
                    if self.halt.is_set():
                        return
                    if i == self.checkpoint:
                        self.at_checkpoint.set()
                        if not self.resume.wait(60):
                            raise TimeoutError("the test did not resume the traffic")
                    self.app.workflow(i)
                    i += 1
                    if phase.pause_s:
                        time.sleep(phase.pause_s)
        except BaseException as exc:  # surfaced by the test, not lost in a thread
            self.error = exc
