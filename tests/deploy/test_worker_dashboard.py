"""The workers dashboard and alert rules: only metrics and labels the code defines, wired into
the compose stack, and checked by Prometheus itself — promtool's rule unit tests, and a real
Prometheus scraping a real worker that evaluates every dashboard query and alert rule."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests._redis import RedisServer, free_port
from tests.worker._batches import batch
from tests.worker._workers import WorkerProcess, read_scores, wait_for
from tracing import CelerySink
from worker.metrics import ALL_METRICS, MetricSpec

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "tracescore-worker.json"
ALERTS = DEPLOY / "grafana" / "alerts" / "tracescore-worker.rules.yml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
RULE_TESTS = Path(__file__).with_name("worker_alerts.test.yml")

# Labels Prometheus adds to every scraped series, and histograms' bucket label.
_TARGET_LABELS = {"instance", "job"}
_METRIC = re.compile(r"\btracescore_[a-z0-9_]+\b")
_SELECTOR = re.compile(r"\b(tracescore_[a-z0-9_]+)\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
# Grafana's variables, as Grafana would fill them in with "All" selected.
_GRAFANA_VARS = {"$__rate_interval": "1m", "$scorer": ".*", "$model": ".*"}


def _series(spec: MetricSpec) -> dict[str, set[str]]:
    """The series names one metric exposes, each with the labels it carries."""
    labels = set(spec.labels)
    if spec.kind == "counter":
        return {f"{spec.name}_total": labels}
    if spec.kind == "histogram":
        return {
            f"{spec.name}_bucket": labels | {"le"},
            f"{spec.name}_sum": labels,
            f"{spec.name}_count": labels,
        }
    return {spec.name: labels}


EXPOSED: dict[str, set[str]] = {name: labels for spec in ALL_METRICS for name, labels in _series(spec).items()}


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return exprs


def _alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def _fill(expr: str) -> str:
    for var, value in _GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return expr


def test_dashboard_and_alerts_use_only_defined_metrics_and_labels() -> None:
    """Every tracescore_* series and label matcher in a query exists in worker.metrics; every
    metric the workers expose is on the dashboard or in an alert."""
    queries = _dashboard_exprs() + [r["expr"] for r in _alert_rules()]
    assert len(queries) > 20
    used = {name for q in queries for name in _METRIC.findall(q)}
    assert used <= set(EXPOSED), sorted(used - set(EXPOSED))
    for query in queries:
        for name, matchers in _SELECTOR.findall(query):
            for label in _MATCHER.findall(matchers):
                assert label in EXPOSED[name] | _TARGET_LABELS, f"{name} has no label {label!r}: {query}"
    shown = {spec.name for spec in ALL_METRICS if any(series in used for series in _series(spec))}
    assert shown == {spec.name for spec in ALL_METRICS}, sorted({s.name for s in ALL_METRICS} - shown)


def test_judge_error_ratios_leave_out_cancelled_calls() -> None:
    """A cancelled judge call is a run timing out or a worker shutting down (worker/metrics), not
    a judge error: the dashboard's error ratio, like the alert, leaves it out, so a rolling update
    does not paint a spike the alert rightly ignores."""
    errors = [
        q
        for q in _dashboard_exprs() + [r["expr"] for r in _alert_rules()]
        if re.search(r'tracescore_judge_requests_total\{[^}]*outcome!="ok"', q)
    ]
    assert len(errors) >= 2
    for query in errors:
        assert 'outcome!="cancelled"' in query, query


def test_runs_stored_leave_out_the_runs_left_for_another_delivery() -> None:
    """outcome="retry" counts a run left unrecorded for the message's retry (counted again when
    it is stored): a panel of runs stored shows scored, not_scorable and failed only, as the
    failing-runs alert's denominator does; the retries are on a panel of their own."""
    dashboard = json.loads(DASHBOARD.read_text())
    stored = [
        t["expr"]
        for p in dashboard["panels"]
        if "stored" in p["title"]
        for t in p.get("targets", [])
        if "tracescore_runs_total" in t["expr"]
    ]
    assert stored
    for query in stored:
        assert 'outcome=~"scored|not_scorable|failed"' in query, query
    retries = [q for q in _dashboard_exprs() if 'tracescore_runs_total{outcome="retry"' in q]
    assert retries


def test_dashboard_reads_the_provisioned_prometheus() -> None:
    """Every panel and variable queries the Prometheus datasource provisioning declares (uid)."""
    dashboard = json.loads(DASHBOARD.read_text())
    (source,) = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yaml").read_text())["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    uses = [p["datasource"] for p in dashboard["panels"] if p["type"] != "row"]
    uses += [t["datasource"] for p in dashboard["panels"] for t in p.get("targets", [])]
    uses += [v["datasource"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert uses
    assert all(u == {"type": "prometheus", "uid": source["uid"]} for u in uses)
    assert dashboard["uid"] == "tracescore-worker"
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_compose_runs_prometheus_on_the_workers_metrics_port() -> None:
    """The compose stack: workers serve :9464, Prometheus scrapes that port and loads the rules,
    Grafana mounts the provisioning and dashboards directories."""
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    env = services["worker"]["environment"]
    config = yaml.safe_load(PROMETHEUS.read_text())
    (job,) = config["scrape_configs"]
    assert job["dns_sd_configs"][0]["port"] == int(env["TRACESCORE_METRICS_PORT"])
    assert job["dns_sd_configs"][0]["names"] == ["worker"]
    mounts = {m.split(":")[0]: m.split(":")[1] for m in services["prometheus"]["volumes"]}
    assert mounts["./prometheus/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    alerts_dir = mounts["./grafana/alerts"]
    assert all(Path(alerts_dir, ALERTS.name).match(pattern) for pattern in config["rule_files"])
    assert "prometheus" in services["grafana"]["depends_on"]


def _installed(binary: str) -> str:
    """Debian's prometheus package, which tests/integration/servers.sh installs in CI: there
    (TRACESCORE_REQUIRE_SERVERS=1) a missing binary fails instead of skipping."""
    found = shutil.which(binary)
    if found is None:
        message = f"{binary} is not installed (Debian: apt-get install prometheus)"
        if os.environ.get("TRACESCORE_REQUIRE_SERVERS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found


def _promtool() -> str:
    return _installed("promtool")


def test_promtool_checks_the_rules_and_their_unit_tests() -> None:
    """`promtool check rules` accepts the file; its unit tests (queue backlog, no worker consuming,
    no worker up, dead-letter growth, a sink's dead letters and dropped scores, judge error rate,
    runs failing, budget, Redis unreachable, a key refused) fire and stay quiet when they should."""
    promtool = _promtool()
    checked = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_alert_rules())} rules found" in checked.stdout
    tested = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name], capture_output=True, text=True, cwd=RULE_TESTS.parent
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


class _Prometheus:
    """A real Prometheus server on a free port, scraping one target every second."""

    def __init__(self, tmp: Path, target: str) -> None:
        binary = _installed("prometheus")
        self.port = free_port()
        config = yaml.safe_load(PROMETHEUS.read_text())
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config["rule_files"] = [str(ALERTS)]
        config["scrape_configs"] = [{"job_name": "tracescore-worker", "static_configs": [{"targets": [target]}]}]
        path = tmp / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        self.log = (tmp / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={path}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:  # a bad query: 400 with Prometheus' error JSON
            return json.loads(exc.read())

    def query(self, expr: str) -> Any:
        return self.api("query", query=expr, time=str(time.time()))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    client = redis_server.client(12)
    client.flushdb()
    try:
        yield redis_server.url(12)
    finally:
        client.flushdb()
        client.close()


def _up(prometheus: _Prometheus) -> bool:
    try:
        return bool(prometheus.api("status/buildinfo")["status"] == "success")
    except OSError:
        return False


def _grouped_by(prometheus: _Prometheus, expr: str, wanted: set[str]) -> bool:
    """``expr``'s results are one per value in ``wanted`` (of the one label it groups by)."""
    return {next(iter(r["metric"].values())) for r in prometheus.query(expr)["data"]["result"]} == wanted


def _has_runs(prometheus: _Prometheus) -> bool:
    result = prometheus.query("sum(tracescore_runs_total)")["data"]["result"]
    return bool(result) and float(result[0]["value"][1]) == 3


def test_prometheus_scrapes_a_worker_and_evaluates_every_query_and_rule(redis_url: str, tmp_path: Path) -> None:
    """A real worker with metrics on, scraped by a real Prometheus loaded with the alert rules:
    every dashboard query is valid PromQL (the main ones return data) and every rule evaluates."""
    port = free_port()
    # First: where prometheus is missing, the test skips before a worker is started and left running.
    prometheus = _Prometheus(tmp_path, f"127.0.0.1:{port}")
    worker = WorkerProcess(
        "promw",
        redis_url,
        tmp_path,
        scores_path=tmp_path / "scores.jsonl",
        scorers="tests.worker.metrics_scorers",
        env={"TRACESCORE_METRICS_PORT": str(port), "TRACESCORE_METRICS_HOST": "127.0.0.1",
             "TRACESCORE_METRICS_DIR": str(tmp_path / "metrics"), "OTEL_EXPORTER_OTLP_ENDPOINT": ""},
    )  # fmt: skip
    try:
        worker.wait_ready()
        sink = CelerySink(redis_url)
        sink.send(batch(range(2), ["fast"], salt="prom"))
        sink.send(batch(range(1), ["broken"], salt="prom"))
        sink.close()
        assert wait_for(lambda: len(read_scores(tmp_path / "scores.jsonl")) >= 3, 30), worker.text()[-2000:]
        assert wait_for(lambda: _up(prometheus), 30)
        assert wait_for(lambda: _has_runs(prometheus), 30, 0.5)

        for expr in _dashboard_exprs():
            if expr.startswith("label_values("):
                metric = expr[len("label_values(") :].split(",")[0]
                answer = prometheus.api("series", **{"match[]": metric})
            else:
                answer = prometheus.query(_fill(expr))
            assert answer["status"] == "success", (expr, answer)
        for expr, wanted in (
            ('sum by (outcome) (rate(tracescore_runs_total{scorer=~".*"}[1m]))', {"scored", "failed"}),
            ("max by (queue) (tracescore_queue_depth)", {"tracescore"}),
            # the solo pool: the worker itself is the one scoring process
            ("sum by (job) (tracescore_worker_processes == 1)", {"tracescore-worker"}),
        ):
            # (a rate needs two scrapes of the series)
            assert wait_for(partial(_grouped_by, prometheus, expr, wanted), 10, 0.5), prometheus.query(expr)

        def rules_evaluated() -> list[dict[str, Any]]:
            groups = prometheus.api("rules")["data"]["groups"]
            return [r for g in groups for r in g["rules"] if r.get("lastEvaluation", "").startswith("2")]

        assert wait_for(lambda: len(rules_evaluated()) == len(_alert_rules()), 30, 0.5)
        rules = rules_evaluated()
        assert {r["name"] for r in rules} == {r["alert"] for r in _alert_rules()}
        assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
        # Nothing is wrong here: no alert fires.
        assert all(r["state"] == "inactive" for r in rules), [(r["name"], r["state"]) for r in rules]
    finally:
        prometheus.stop()
        worker.stop()


def test_kubernetes_pods_expose_the_metrics_port_they_serve() -> None:
    """The ConfigMap's TRACESCORE_METRICS_PORT is the container's "metrics" port and the port
    the pod's prometheus.io annotations name."""
    config = yaml.safe_load((DEPLOY / "k8s" / "configmap.yaml").read_text())["data"]
    deployment = yaml.safe_load((DEPLOY / "k8s" / "worker-deployment.yaml").read_text())
    template = deployment["spec"]["template"]
    (container,) = template["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    port = int(config["TRACESCORE_METRICS_PORT"])
    assert ports["metrics"] == port
    assert template["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    assert template["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
