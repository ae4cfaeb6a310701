"""The node's metrics through OTLP/HTTP: a local receiver decodes the protobuf the worker pushes
and finds the same counters and histograms /metrics shows."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import accumulate
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from tests._redis import free_port
from tests.worker._batches import batch
from tests.worker._workers import WorkerProcess, read_scores, wait_for
from tests.worker.test_metrics import scrape, series, total
from tracing import CelerySink


class MetricsReceiver:
    """POST /v1/metrics on a free loopback port; keeps every decoded export request."""

    def __init__(self) -> None:
        self.port = free_port()
        self.exports: list[ExportMetricsServiceRequest] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = ExportMetricsServiceRequest()
                request.ParseFromString(body)
                with receiver._lock:
                    receiver.exports.append(request)
                    receiver.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def latest(self) -> ExportMetricsServiceRequest | None:
        with self._lock:
            return self.exports[-1] if self.exports else None

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _points(export: ExportMetricsServiceRequest | None, name: str) -> dict[frozenset[tuple[str, str]], Any]:
    """The data points of metric ``name`` in one export, by their attributes."""
    out: dict[frozenset[tuple[str, str]], Any] = {}
    if export is None:
        return out
    for resource in export.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != name:
                    continue
                kind = metric.WhichOneof("data")
                for point in getattr(metric, kind).data_points:
                    labels = frozenset((a.key, a.value.string_value) for a in point.attributes)
                    out[labels] = point
    return out


def _metrics_env(receiver: MetricsReceiver, port: int, tmp_path: Path) -> dict[str, str]:
    """A worker's /metrics on ``port`` and its OTLP metrics to ``receiver``, every 0.3 s."""
    return {
        "TRACESCORE_METRICS_PORT": str(port),
        "TRACESCORE_METRICS_HOST": "127.0.0.1",
        "TRACESCORE_METRICS_DIR": str(tmp_path / "metrics"),
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"http://127.0.0.1:{receiver.port}/v1/metrics",
        "OTEL_METRIC_EXPORT_INTERVAL": "300",
    }


@pytest.fixture
def receiver() -> Iterator[MetricsReceiver]:
    r = MetricsReceiver()
    yield r
    r.stop()


def test_otlp_export_carries_the_same_counters_as_the_scrape(
    receiver: MetricsReceiver, redis_url: str, tmp_path: Path
) -> None:
    """A prefork worker ×2 with both outputs on: the OTLP runs counter, batch histogram and
    resource name match /metrics; stopping the worker sends a last export."""
    port = free_port()
    scores_path = tmp_path / "scores.jsonl"
    worker = WorkerProcess(
        "otlpm",
        redis_url,
        tmp_path,
        scores_path=scores_path,
        pool="prefork",
        concurrency=2,
        scorers="tests.worker.metrics_scorers",
        env=_metrics_env(receiver, port, tmp_path),
    )
    try:
        worker.wait_ready()
        sink = CelerySink(redis_url)
        for n in range(5):
            sink.send(batch(range(n, n + 1), ["fast"], salt="otlp-fast"))
        sink.send(batch(range(2), ["broken"], salt="otlp-broken"))
        sink.close()
        assert wait_for(lambda: len(read_scores(scores_path)) >= 7, 60), worker.text()[-3000:]

        def runs_in_latest_export() -> float:
            return float(sum(p.as_double for p in _points(receiver.latest(), "tracescore_runs_total").values()))

        assert wait_for(lambda: runs_in_latest_export() == 7, 20), receiver.paths
        assert set(receiver.paths) == {"/v1/metrics"}
        export = receiver.latest()
        scraped = scrape(port)

        runs = {labels: p.as_double for labels, p in _points(export, "tracescore_runs_total").items()}
        assert runs == series(scraped, "tracescore_runs_total")
        assert runs[frozenset({("scorer", "fast"), ("outcome", "scored"), ("reason", "")})] == 5
        assert runs[frozenset({("scorer", "broken"), ("outcome", "failed"), ("reason", "ValueError")})] == 2

        ((labels, hist),) = _points(export, "tracescore_batch_duration_seconds").items()
        assert labels == frozenset()
        assert hist.count == 6 == total(scraped, "tracescore_batch_duration_seconds_count")
        assert hist.sum == pytest.approx(total(scraped, "tracescore_batch_duration_seconds_sum"))
        # OTLP counts per bucket; Prometheus' "le" buckets are their running sums.
        scraped_buckets = sorted(
            (float(dict(k)["le"]), v)
            for (name, k), v in scraped.items()
            if name == "tracescore_batch_duration_seconds_bucket"
        )
        assert list(accumulate(hist.bucket_counts)) == [v for _, v in scraped_buckets]
        assert list(hist.explicit_bounds) == [le for le, _ in scraped_buckets[:-1]]

        processes = _points(export, "tracescore_worker_processes")
        assert [p.as_double for p in processes.values()] == [2]
        (resource,) = export.resource_metrics  # type: ignore[union-attr]
        attributes = {a.key: a.value.string_value for a in resource.resource.attributes}
        assert attributes["service.name"] == "tracescore-worker"
        assert attributes["service.instance.id"].startswith("otlpm@")
    finally:
        exports_before_stop = len(receiver.exports)
        worker.stop()
    # The parent's shutdown pushes once more (what happened since the last interval).
    assert len(receiver.exports) > exports_before_stop


def test_otlp_metrics_headers_the_exporter_cannot_read_fail_the_start_without_their_value(
    receiver: MetricsReceiver, redis_url: str, tmp_path: Path
) -> None:
    """An authorization header not percent-encoded in OTEL_EXPORTER_OTLP_METRICS_HEADERS: the
    metrics exporter dropped it with a warning quoting the token, and every push was sent
    without it. Now the worker does not start: it names the variable and the header, never the
    value, and nothing reached the endpoint."""
    port = free_port()
    worker = WorkerProcess(
        "badheaders",
        redis_url,
        tmp_path,
        scores_path=tmp_path / "scores.jsonl",
        env={
            **_metrics_env(receiver, port, tmp_path),
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "x-team=a,authorization=Bearer tok 0123456789\x01",
        },
    )
    try:
        assert wait_for(lambda: worker.proc.poll() is not None, 60), worker.text()[-2000:]
        said = worker.text()
        assert worker.proc.returncode != 0
        assert (
            "tracescore worker cannot start: metrics: the OTLP exporter's headers"
            " (OTEL_EXPORTER_OTLP_METRICS_HEADERS) hold the entry for 'authorization'" in said
        ), said[-2000:]
        assert "0123456789" not in said
        assert " ready." not in said
        assert receiver.exports == []
    finally:
        worker.stop()


@pytest.mark.parametrize("otlp_metrics", ["true", "false"])
def test_the_general_otlp_endpoint_carries_the_metrics_unless_tracescore_otlp_metrics_is_false(
    receiver: MetricsReceiver, redis_url: str, tmp_path: Path, otlp_metrics: str
) -> None:
    """The README: metrics go out through OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is set (its
    /v1/metrics), and TRACESCORE_OTLP_METRICS=false keeps them off while that endpoint stays set
    for the scores. Either way the worker's shutdown pushes a last export when they are on, so
    after the stop the receiver has seen /v1/metrics exactly when they are."""
    port = free_port()
    env = {
        **_metrics_env(receiver, port, tmp_path),
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
        "TRACESCORE_OTLP_METRICS": otlp_metrics,
    }
    scores_path = tmp_path / "scores.jsonl"
    worker = WorkerProcess(
        "otlpg", redis_url, tmp_path, scores_path=scores_path, scorers="tests.worker.metrics_scorers", env=env
    )
    try:
        worker.wait_ready()
        sink = CelerySink(redis_url)
        sink.send(batch(range(2), ["fast"], salt="otlp-general"))
        sink.close()
        assert wait_for(lambda: len(read_scores(scores_path)) == 2, 60), worker.text()[-3000:]
        assert wait_for(lambda: total(scrape(port), "tracescore_runs_total") == 2, 10)
    finally:
        worker.stop()
    if otlp_metrics == "true":
        assert "/v1/metrics" in receiver.paths
        assert sum(p.as_double for p in _points(receiver.latest(), "tracescore_runs_total").values()) == 2
    else:
        assert "/v1/metrics" not in receiver.paths, receiver.paths
