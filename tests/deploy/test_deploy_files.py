"""deploy/ stays true to the code: every file parses, and every setting, command, option, file and
trace attribute it names is one the code really has (read from the code, never copied here)."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from worker._settings import Settings, SettingsError, load_settings
from worker.cli import cli

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "tracescore-scores.json"
DEPLOY_README = DEPLOY / "README.md"
BENCH_CLI = ROOT / "bench" / "cli.py"
BENCH_CLI_RESULT = ROOT / "bench" / "results" / "cli.json"
WRITER_SOURCE = ROOT / "tracing" / "sinks" / "_otlp.py"
MARKERS_SOURCE = ROOT / "tracing" / "_markers.py"

_VARIABLE = re.compile(r"\bTRACESCORE_[A-Z0-9_]*[A-Z0-9]\b")
_COMPOSE_DEFAULT = re.compile(r"\$\{([A-Z0-9_]+):-([^}]*)\}")


def _deploy_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.is_file())


def _yaml_docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _k8s_objects() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, d) for p in sorted(K8S.rglob("*.yaml")) if p.name != "kustomization.yaml" for d in _yaml_docs(p)]


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for _, d in _k8s_objects() if d["kind"] == kind and name in (None, d["metadata"].get("name"))]
    assert len(found) == 1, f"expected one {kind} {name or ''} in deploy/k8s, found {len(found)}"
    return found[0]


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return data


def _compose_value(text: str) -> str:
    """A compose string with ``${VAR:-default}`` resolved to its default (the out-of-the-box value)."""
    return _COMPOSE_DEFAULT.sub(lambda m: m.group(2), text)


def _settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in list(os.environ):
        if name.startswith("TRACESCORE_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("TRACESCORE_"):
            monkeypatch.setenv(name, value)
    return load_settings()


def _duration_s(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    assert match, f"not a compose duration: {text!r}"
    return float(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[match.group(2)]


# --- invocations of the `tracescore` command -------------------------------------------------


def _code_fragments(text: str) -> Iterator[str]:
    """Shell-ish code in prose and comments: fenced blocks (line by line) and `inline` spans."""
    text = text.replace("\\\n", " ")
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        yield from block.splitlines()
    yield from re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))


def _tokens_after_tracescore(fragment: str) -> Iterator[list[str]]:
    for segment in re.split(r"\|\||&&|[|;>]|\$\(|\)", fragment):
        try:
            words = shlex.split(segment, comments=False)
        except ValueError:
            words = segment.split()
        for i, word in enumerate(words):
            if i and words[i - 1] in {"-n", "--namespace"}:  # kubectl -n tracescore: the namespace
                continue
            if word == "tracescore" and i + 1 < len(words) and re.fullmatch(r"[a-z][a-z-]*", words[i + 1]):
                yield words[i + 1 :]


def _structured_invocations() -> Iterator[tuple[str, list[str]]]:
    """Arguments handed to the image's `tracescore` entrypoint, and exec probes calling it."""
    for path, obj in _k8s_objects():
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []):
            if container["image"].split(":")[0].endswith("tracescore"):
                yield f"{path.name}:{container['name']}", [str(a) for a in container["args"]]
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                command = container.get(probe, {}).get("exec", {}).get("command", [])
                if command[:1] == ["tracescore"]:
                    yield f"{path.name}:{probe}", command[1:]
    images = {name: s.get("image", "") for name, s in _compose()["services"].items()}
    for name, service in _compose()["services"].items():
        if images[name].startswith("tracescore"):
            yield f"docker-compose.yml:{name}", [str(a) for a in service["command"]]
        check = [str(a) for a in service.get("healthcheck", {}).get("test", [])]
        if check[:2] == ["CMD", "tracescore"]:
            yield f"docker-compose.yml:{name}:healthcheck", check[2:]
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        match = re.search(r"\bCMD\s+(\[.*\])\s*$", line)
        if match:
            # HEALTHCHECK CMD runs the program itself; a bare CMD is arguments to the entrypoint.
            argv = json.loads(match.group(1))
            yield "Dockerfile", argv[1:] if argv[:1] == ["tracescore"] else argv


def _all_invocations() -> list[tuple[str, list[str]]]:
    found = list(_structured_invocations())
    for path in _deploy_files():
        if path.suffix in {".json", ".gz"}:
            continue
        for fragment in _code_fragments(path.read_text(encoding="utf-8")):
            for words in _tokens_after_tracescore(fragment):
                found.append((str(path.relative_to(ROOT)), words))
    return found


def _option_names(command: click.Command) -> set[str]:
    names = {"--help", "-h"}
    for param in command.params:
        if isinstance(param, click.Option):
            names.update(param.opts + param.secondary_opts)
    return names


def _check_invocation(where: str, words: list[str]) -> None:
    command: click.Command = cli
    rest = list(words)
    ctx = click.Context(cli)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        name = rest.pop(0)
        sub = command.get_command(ctx, name)
        assert sub is not None, (
            f"{where}: `tracescore {' '.join(words)}`: {name!r} is not a command; "
            f"{command.name or 'tracescore'} has {command.list_commands(ctx)}"
        )
        command = sub
    for word in rest:
        option = word.split("=", 1)[0]
        if option.startswith("--"):
            assert option in _option_names(command), (
                f"{where}: `tracescore {' '.join(words)}`: {command.name} has no option {option}; "
                f"it has {sorted(_option_names(command))}"
            )


# --- what the score writer really writes ---------------------------------------------------------


def _writer_attributes() -> tuple[set[str], set[str], set[str]]:
    """(carrier span attribute keys, evaluation event attribute keys, every string in the module)."""
    tree = ast.parse(WRITER_SOURCE.read_text(encoding="utf-8"))
    # The module's string constants and those it imports from the markers module (the role).
    markers = ast.parse(MARKERS_SOURCE.read_text(encoding="utf-8"))
    constants = {
        node.targets[0].id: node.value.value
        for module in (markers, tree)
        for node in module.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }

    def keys(d: ast.Dict) -> set[str]:
        out = set()
        for key in d.keys:
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                out.add(key.value)
            elif isinstance(key, ast.Name) and key.id in constants:
                out.add(constants[key.id])
        return out

    span_keys: set[str] = set()
    event_keys: set[str] = set()
    for node in ast.walk(tree):
        # The carrier span is built whole (ReadableSpan(...)), its attributes a keyword argument.
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ReadableSpan":
            for kw in node.keywords:
                if kw.arg == "attributes" and isinstance(kw.value, ast.Dict):
                    span_keys |= keys(kw.value)
        if isinstance(node, ast.FunctionDef) and node.name == "evaluation_attributes":
            for inner in ast.walk(node):
                if isinstance(inner, ast.Dict):
                    event_keys |= keys(inner)
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return span_keys, event_keys, strings


def _dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [t["query"] for panel in dashboard["panels"] for t in panel["targets"]]


# --- tests ---------------------------------------------------------------------------------------


def test_every_yaml_and_json_file_parses() -> None:
    """Each YAML (all documents) and JSON file under deploy/ parses to something non-empty."""
    checked = 0
    for path in _deploy_files():
        if path.suffix in {".yaml", ".yml"}:
            assert _yaml_docs(path), f"{path} is empty"
            checked += 1
        elif path.suffix == ".json":
            assert json.loads(path.read_text(encoding="utf-8")), f"{path} is empty"
            checked += 1
    assert checked >= 15


def test_tracescore_variables_are_settings_fields() -> None:
    """Every TRACESCORE_* name in deploy/ is a Settings field (or one the example scorer module reads)."""
    fields = {f"TRACESCORE_{name.upper()}" for name in Settings.model_fields}
    example_reads = {
        m.group(1)
        for p in (ROOT / "examples").glob("*.py")
        for m in re.finditer(r"environ(?:\.get\(|\[)\s*[\"'](TRACESCORE_[A-Z0-9_]+)", p.read_text(encoding="utf-8"))
    }
    used: dict[str, set[str]] = {}
    for path in _deploy_files():
        for name in _VARIABLE.findall(path.read_text(encoding="utf-8")):
            used.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    unknown = {name: sorted(where) for name, where in used.items() if name not in fields | example_reads}
    assert not unknown, f"not Settings fields: {unknown}; the fields are {sorted(fields)}"
    assert len(used) >= 10


def test_configmap_and_compose_settings_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ConfigMap's and the compose workers' TRACESCORE_* values pass the Settings validation."""
    config = _one("ConfigMap", "tracescore-config")["data"]
    settings = _settings_from(config, monkeypatch)
    assert settings.queue == config["TRACESCORE_QUEUE"]
    assert settings.rate_limits, "TRACESCORE_RATE_LIMITS in the ConfigMap should parse to per-model limits"
    compose_env = {k: _compose_value(str(v)) for k, v in _compose()["x-tracescore-env"].items()}
    assert _settings_from(compose_env, monkeypatch).writer == "otlp"


def test_grace_periods_fit_the_shutdown_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pods and compose workers wait before SIGKILL for what the code takes at most: the grace
    period, then the one cleanup deadline every step of the way out shares, then the exit
    allowance (worker._loop); and not much longer (a rolling update waits for it). The default
    grace stays inside Kubernetes' default 30 s, and the cancelled runs' own cleanup wait fits
    inside the cleanup time (leaving time for the sinks' last deliveries)."""
    from worker._loop import CLEANUP_S, EXIT_ALLOWANCE_S

    defaults = Settings()
    assert defaults.shutdown_grace_seconds < 30
    assert defaults.shutdown_cleanup_seconds > CLEANUP_S
    pod = _one("Deployment", "tracescore-worker")["spec"]["template"]["spec"]
    compose_env = {k: _compose_value(str(v)) for k, v in _compose()["x-tracescore-env"].items()}
    compose = _settings_from(compose_env, monkeypatch)
    config = _settings_from(_one("ConfigMap", "tracescore-config")["data"], monkeypatch)
    for where, settings, kill_after in (
        ("deployment", config, float(pod["terminationGracePeriodSeconds"])),
        ("compose", compose, _duration_s(_compose()["services"]["worker"]["stop_grace_period"])),
    ):
        needed = settings.shutdown_grace_seconds + settings.shutdown_cleanup_seconds + EXIT_ALLOWANCE_S
        assert needed <= kill_after <= needed + 15, (where, needed, kill_after)
        assert settings.shutdown_cleanup_seconds > CLEANUP_S, where


def test_liveness_max_age_outlasts_the_loop_watchdog(monkeypatch: pytest.MonkeyPatch) -> None:
    """`probe live --max-age` is past the loop watchdog's last limit, so the probe fires only when
    the watchdog failed: a step blocking past the run timeout is interrupted at that timeout, but a
    loop kept from turning by one short blocking step after another only at LOOP_BLOCK_LIMITS run
    timeouts plus its grace (worker._loop: 543 s with the defaults). The probe's 240 s fired first:
    the pod was restarted instead, and the batch its SIGTERM requeued (not counted as a crash)
    could block the next pod alike. Every `probe live --max-age` in deploy/ and the README says
    the manifests' value."""
    from worker._loop import LOOP_BLOCK_LIMITS, WATCHDOG_GRACE_S

    container = _one("Deployment", "tracescore-worker")["spec"]["template"]["spec"]["containers"][0]
    compose_env = {k: _compose_value(str(v)) for k, v in _compose()["x-tracescore-env"].items()}
    max_ages = set()
    for where, command, env in (
        ("deployment", container["livenessProbe"]["exec"]["command"], _one("ConfigMap", "tracescore-config")["data"]),
        ("compose", _compose()["services"]["worker"]["healthcheck"]["test"], compose_env),
    ):
        max_age = float(command[command.index("--max-age") + 1])
        settings = _settings_from(env, monkeypatch)
        watchdog = LOOP_BLOCK_LIMITS * settings.run_timeout + WATCHDOG_GRACE_S
        assert max_age > watchdog, f"{where}: --max-age {max_age:g} is inside the watchdog's {watchdog:g} s"
        max_ages.add(f"{max_age:g}")
    assert len(max_ages) == 1, max_ages
    for path in [*_deploy_files(), ROOT / "README.md"]:
        if path.suffix in {".json", ".gz"}:
            continue
        text = path.read_text(encoding="utf-8")
        said = re.findall(r"probe live --max-age (\d+)", text) + re.findall(r"turned within (\d+) s", text)
        assert set(said) <= max_ages, (path, said, max_ages)


def test_deploy_readme_gives_the_latest_probe_costs() -> None:
    """The probes' CPU the deploy README and the README's Benchmarks row give is what bench/cli.py
    last measured (bench/results/cli.json), at the periods the Deployment runs them (the deploy
    README kept the first measurement, 0.56 and 0.53 CPU-s and 54 millicores a pod, after the
    probes had become several times cheaper)."""
    container = _one("Deployment", "tracescore-worker")["spec"]["template"]["spec"]["containers"][0]
    periods = re.search(r"^READY_PERIOD_S, LIVE_PERIOD_S = (\d+), (\d+)", BENCH_CLI.read_text(encoding="utf-8"), re.M)
    assert periods, BENCH_CLI
    assert int(periods.group(1)) == container["readinessProbe"]["periodSeconds"]
    assert int(periods.group(2)) == container["livenessProbe"]["periodSeconds"]
    result = json.loads(BENCH_CLI_RESULT.read_text(encoding="utf-8"))
    cpu = result["cpu_s"]["this tree"]
    expected = {
        "live": f"{cpu['tracescore probe live']:.2f}",
        "ready": f"{cpu['tracescore probe ready']:.2f}",
        "millicores": f"{result['pod_probe_millicores']['this tree']:.0f}",
    }
    for path in (DEPLOY_README, ROOT / "README.md"):
        text = path.read_text(encoding="utf-8")
        said = {
            "live": re.search(r"`probe live` (\d+\.\d+)", text),
            "ready": re.search(r"`probe ready` (\d+\.\d+)", text),
            "millicores": re.search(r"(\d+) millicores a (?:worker )?pod", text),
        }
        assert all(said.values()), (path, said)
        assert {k: m.group(1) for k, m in said.items() if m} == expected, path


def test_deploy_readme_settings_table_gives_the_code_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each row of the deploy README's settings table gives the setting's default in the code; the
    score TTL's row is there and gives the shortest TTL the settings accept (a day: refused below)."""
    defaults = _settings_from({}, monkeypatch)
    rows = dict(re.findall(r"^\| `(TRACESCORE_[A-Z_]+)` \| (.*)$", DEPLOY_README.read_text(encoding="utf-8"), re.M))
    assert len(rows) >= 4
    for variable, row in rows.items():
        default = re.match(r"\s*(\d+(?:\.\d+)?)", row)
        assert default, f"{variable}: no default in {row!r}"
        field = variable.removeprefix("TRACESCORE_").lower()
        assert float(default.group(1)) == float(getattr(defaults, field)), (variable, row)
    minimum = re.search(r"at least (\d+)", rows["TRACESCORE_SCORE_TTL_SECONDS"])
    assert minimum, rows["TRACESCORE_SCORE_TTL_SECONDS"]
    assert load_settings(score_ttl_seconds=int(minimum.group(1))).score_ttl_seconds == int(minimum.group(1))
    with pytest.raises(SettingsError, match="TRACESCORE_SCORE_TTL_SECONDS"):
        load_settings(score_ttl_seconds=int(minimum.group(1)) - 1)


def test_probes_are_tracescore_probe_with_the_probe_dir_set() -> None:
    """The worker's liveness/readiness/startup probes and the compose healthcheck run `tracescore
    probe`, and TRACESCORE_PROBE_DIR is set where they run (ConfigMap, compose env)."""
    container = _one("Deployment", "tracescore-worker")["spec"]["template"]["spec"]["containers"][0]
    for probe, verb in (("livenessProbe", "live"), ("readinessProbe", "ready"), ("startupProbe", "ready")):
        assert container[probe]["exec"]["command"][:3] == ["tracescore", "probe", verb], probe
    assert _one("ConfigMap", "tracescore-config")["data"]["TRACESCORE_PROBE_DIR"].startswith("/tmp/")
    assert {"mountPath": "/tmp", "name": "tmp"} in container["volumeMounts"]  # writable: the root fs is not
    worker = _compose()["services"]["worker"]
    assert worker["healthcheck"]["test"][:4] == ["CMD", "tracescore", "probe", "live"]
    assert _compose()["x-tracescore-env"]["TRACESCORE_PROBE_DIR"]


def test_tracescore_invocations_are_real_commands_and_options() -> None:
    """Every `tracescore <command> --option` in deploy/ exists in worker.cli's click group."""
    invocations = _all_invocations()
    for where, words in invocations:
        _check_invocation(where, words)
    commands = {words[0] for _, words in invocations}
    assert {"worker", "status", "backfill", "dlq", "scores"} <= commands


def test_invocation_check_rejects_unknown_commands_and_options() -> None:
    """The invocation check itself fails on a made-up command, subcommand or option."""
    for words in (["serve"], ["dlq", "purge"], ["worker", "--threads", "4"]):
        with pytest.raises(AssertionError):
            _check_invocation("test", words)


def test_dockerfile_entrypoint_is_the_console_script() -> None:
    """ENTRYPOINT is pyproject's console script, which resolves to a callable; the user is not root."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    entrypoint = json.loads(re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", text, flags=re.M).group(1))  # type: ignore[union-attr]
    assert len(entrypoint) == 1
    assert entrypoint[0] in scripts
    module, _, attr = scripts[entrypoint[0]].partition(":")
    assert callable(getattr(__import__(module, fromlist=[attr]), attr))
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.M)
    assert users
    assert all(u.split(":")[0] not in {"root", "0"} for u in users)
    assert re.search(r'HEALTHCHECK .*CMD \["tracescore", "status"', text.replace("\\\n", " "))
    assert "--extra" not in text
    assert "[dev]" not in text


def test_dockerfile_copies_exist_and_pass_the_dockerignore() -> None:
    """Every build-context path the Dockerfile COPYs exists and is re-included by dockerignore.example."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, flags=re.M))
    sources = []
    for line in re.findall(r"^COPY\s+(?!--from)(.*)$", text, flags=re.M):
        parts = [p for p in line.split() if not p.startswith("--")][:-1]
        sources += [re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], p).rstrip("/") for p in parts]
    allowed = {
        line[1:].rstrip("/")
        for line in (DEPLOY / "dockerignore.example").read_text(encoding="utf-8").splitlines()
        if line.startswith("!")
    }
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"Dockerfile copies {source}, which is not in the repository"
        assert source in allowed, f"dockerignore.example excludes {source}, which the Dockerfile copies"


def test_compose_services_reference_existing_files() -> None:
    """Build contexts, Dockerfiles, bind mounts, env files and dependencies of compose services exist."""
    services = _compose()["services"]
    built_images = {s["image"] for s in services.values() if "build" in s}
    for name, service in services.items():
        if "build" in service:
            context = DEPLOY / service["build"]["context"]
            assert (context / service["build"]["dockerfile"]).is_file(), name
        elif service["image"].startswith("tracescore"):
            assert service["image"] in built_images, f"{name} uses {service['image']}, which no service builds"
        for volume in service.get("volumes", []):
            source = _compose_value(volume).split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name} mounts {source}, which does not exist"
        for env_file in service.get("env_file", []):
            path = DEPLOY / env_file["path"]
            assert path.exists() or (env_file.get("required") is False and path.with_suffix(".env.example").exists())
        for dependency in service.get("depends_on", []):
            assert dependency in services, f"{name} depends on unknown service {dependency}"


def test_compose_workers_export_to_the_collectors_http_port() -> None:
    """The workers' OTLP/HTTP endpoint is the Collector's HTTP receiver port, and the Collector exports to Tempo."""
    compose = _compose()
    endpoint = compose["x-tracescore-env"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
    collector = yaml.safe_load((DEPLOY / "otel-collector.yaml").read_text(encoding="utf-8"))
    http_port = collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"].rsplit(":", 1)[1]
    assert endpoint == f"http://otel-collector:{http_port}"
    tempo_endpoint = compose["services"]["otel-collector"]["environment"]["TEMPO_OTLP_ENDPOINT"]
    assert tempo_endpoint.split(":")[0] in compose["services"]


def test_collector_pipeline_is_complete_and_keeps_span_events() -> None:
    """Pipelines use defined components, memory_limiter runs first, nothing filters spans or events."""
    collector = yaml.safe_load((DEPLOY / "otel-collector.yaml").read_text(encoding="utf-8"))
    protocols = collector["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317")
    assert protocols["http"]["endpoint"].endswith(":4318")
    for name, pipeline in collector["service"]["pipelines"].items():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline[kind]:
                assert component in collector[kind], f"pipeline {name} uses undefined {kind[:-1]} {component}"
        assert pipeline["processors"][0] == "memory_limiter"
        assert not [p for p in pipeline["processors"] if p.split("/")[0] in {"filter", "transform", "attributes"}]
        assert "debug" in pipeline["exporters"]
        assert any(e.startswith("otlp") for e in pipeline["exporters"])


def test_dashboard_queries_use_attributes_the_writer_writes() -> None:
    """span./event. attributes in the dashboard's TraceQL are ones tracing/sinks/_otlp.py sets in that scope."""
    span_keys, event_keys, strings = _writer_attributes()
    assert "tracescore.role" in span_keys, WRITER_SOURCE
    assert "gen_ai.evaluation.name" in event_keys, WRITER_SOURCE
    queries = _dashboard_queries()
    assert queries
    scopes = {"span": span_keys, "event": event_keys, "resource": strings}
    for query in queries:
        for scope, name in re.findall(r"\b(span|event|resource)\.([A-Za-z_][A-Za-z0-9_.]*[A-Za-z0-9_])", query):
            assert name in scopes[scope], (
                f"{scope}.{name} in {query!r}: the score writer sets no such {scope} attribute"
            )
        for value in re.findall(r'span\.tracescore\.role\s*=\s*"([^"]+)"', query):
            assert value in strings, f"tracescore.role {value!r} is never written"
        for value in re.findall(r'event:name\s*=\s*"([^"]+)"', query):
            assert value in strings
    assert any("event.gen_ai.evaluation.score.value" in q for q in queries)
    assert any("event.error.type" in q for q in queries)
    assert any("gen_ai.usage.input_tokens" in q for q in queries)


def test_dashboard_metrics_count_score_events_not_carrier_spans() -> None:
    """Each TraceQL metrics panel selects evaluation events (event:name) and groups by the scorer
    id: TraceQL metrics count matching spans, and the OTLP sink writes one carrier span per score
    (tests/tracing/test_sinks.py), so each series counts scores. By the id, not the display name
    (gen_ai.evaluation.name): the Workers dashboard and `tracescore status` name scorers by id, and
    a built-in's name differs from it ("Tone consistency", "tone-consistency")."""
    _, _, strings = _writer_attributes()
    metrics = [q for q in _dashboard_queries() if "|" in q]
    assert len(metrics) >= 4
    for query in metrics:
        selector, _, function = query.partition("|")
        assert re.search(r'event:name\s*=\s*"gen_ai\.evaluation\.result"', selector), query
        assert function.strip().endswith("by (event.tracescore.scorer.id)"), query
    for query in _dashboard_queries():
        if "$scorer" in query:
            assert 'event.tracescore.scorer.id = "$scorer"' in query, query
    assert "gen_ai.evaluation.result" in strings


def test_tempo_is_2_6_or_later_and_keeps_carrier_spans_for_metrics() -> None:
    """Compose pins a Tempo 2.x at or past 2.6 (TraceQL over events); its metrics generator's
    local-blocks processor keeps every span, not only server spans (carriers are internal)."""
    tempo = _compose()["services"]["tempo"]["image"]
    match = re.fullmatch(r"grafana/tempo:(\d+)\.(\d+)\.(\d+)", tempo)
    assert match, f"pin an exact Tempo version, not {tempo!r}"
    assert (2, 6) <= (int(match.group(1)), int(match.group(2))) < (3, 0)
    config = yaml.safe_load((DEPLOY / "tempo.yaml").read_text(encoding="utf-8"))
    local_blocks = config["metrics_generator"]["processor"]["local_blocks"]
    assert local_blocks["filter_server_spans"] is False
    assert "local-blocks" in config["overrides"]["defaults"]["metrics_generator"]["processors"]


def test_tempo_takes_late_carrier_spans_and_the_collectors_batches() -> None:
    """A carrier span ends when the span it scores ended (tracing/sinks/_otlp.py), so it reaches
    Tempo late: by seconds to minutes live, by days in a backfill. Tempo's metrics generator drops
    spans older than its ingestion slack (30 s by default), and the dashboard's metrics panels then
    never count those scores: the slack covers the traces' retention. And the Collector's largest
    batch, at 32 KiB a span (agent messages), fits Tempo's gRPC message limit (4 MiB by default):
    a batch Tempo refuses as too large is dropped after the workers counted it delivered."""
    config = yaml.safe_load((DEPLOY / "tempo.yaml").read_text(encoding="utf-8"))
    slack = _duration_s(config["metrics_generator"]["metrics_ingestion_time_range_slack"])
    assert slack >= _duration_s(config["compactor"]["compaction"]["block_retention"])
    grpc = config["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]
    limit_bytes = grpc.get("max_recv_msg_size_mib", 4) * 2**20
    collector = yaml.safe_load((DEPLOY / "otel-collector.yaml").read_text(encoding="utf-8"))
    assert "tempo:4317" in _compose()["services"]["otel-collector"]["environment"]["TEMPO_OTLP_ENDPOINT"]
    batch = collector["processors"]["batch"]
    assert batch["send_batch_max_size"] * 32 * 2**10 <= limit_bytes


def test_dashboard_default_scorer_exists_and_datasource_is_provisioned() -> None:
    """The dashboard's default scorer id is in examples.scorers; its datasource uid and folder are provisioned."""
    from worker._registry import load_registry

    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "scorer")
    assert variable["query"] in {s.id for s in load_registry("examples.scorers").values()}
    datasources = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/tempo.yaml").read_text(encoding="utf-8"))
    uids = {d["uid"] for d in datasources["datasources"]}
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} <= uids
    providers = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/tracescore.yaml").read_text(encoding="utf-8"))
    grafana_mounts = _compose()["services"]["grafana"]["volumes"]
    assert f"./grafana/dashboards:{providers['providers'][0]['options']['path']}:ro" in grafana_mounts


def test_compose_redis_is_private_and_password_protected() -> None:
    """Redis holds agent inputs and outputs: compose publishes it on the loopback interface only,
    with a password, and every broker URL the stack uses carries that password."""
    redis = _compose()["services"]["redis"]
    assert [_compose_value(p).split(":")[0] for p in redis["ports"]] == ["127.0.0.1"]
    command = [_compose_value(str(a)) for a in redis["command"]]
    password = command[command.index("--requirepass") + 1]
    assert password
    assert _compose_value(redis["environment"]["REDISCLI_AUTH"]) == password
    text = _compose_value(COMPOSE.read_text(encoding="utf-8"))
    urls = re.findall(r"redis://\S*@?redis:6379/\d+", text)
    assert len(urls) == 2
    assert all(url.startswith(f"redis://:{password}@") for url in urls), urls


def test_backfill_jobs_score_with_the_workers_scorers() -> None:
    """The backfill Jobs live outside kustomize: they take the workers' scorer modules from the
    ConfigMap (an image without examples/ failed on a hard-coded examples.scorers), and their
    image is the one kustomization.yaml names out of the box (the README says to set both)."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    (image,) = kustomization["images"]
    configmap = _one("ConfigMap")
    assert configmap["data"]["TRACESCORE_SCORERS"]
    jobs = [(p, d) for p, d in _k8s_objects() if d["kind"] == "Job"]
    assert len(jobs) == 2
    for path, job in jobs:
        (container,) = job["spec"]["template"]["spec"]["containers"]
        assert container["image"] == f"{image['newName']}:{image['newTag']}", path
        assert {"configMapRef": {"name": configmap["metadata"]["name"]}} in container["envFrom"], path
        args = [str(a) for a in container["args"]]
        if "--scorers" in args:
            assert args[args.index("--scorers") + 1] == "$(TRACESCORE_SCORERS)", path
    assert "name the image themselves" in (DEPLOY / "README.md").read_text(encoding="utf-8")


def test_kustomization_resources_exist_and_wire_together() -> None:
    """Kustomize resources exist; HPA, PDB, KEDA and env sources point at what the manifests define."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    for resource in kustomization["resources"]:
        assert (K8S / resource).is_file(), f"kustomization lists missing {resource}"
    deployment = _one("Deployment", "tracescore-worker")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert _one("HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]["name"] == "tracescore-worker"
    assert _one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    keda = _one("ScaledObject")
    assert keda["spec"]["scaleTargetRef"]["name"] == "tracescore-worker"
    queue = _one("ConfigMap", "tracescore-config")["data"]["TRACESCORE_QUEUE"]
    assert keda["spec"]["triggers"][0]["metadata"]["listName"] == queue
    defined = {(d["kind"], d["metadata"].get("name")) for _, d in _k8s_objects()}
    for path, obj in _k8s_objects():
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []):
            for source in container.get("envFrom", []):
                kind, ref = next(iter(source.items()))
                expected = ("ConfigMap" if kind == "configMapRef" else "Secret", ref["name"])
                assert expected in defined, f"{path.name} reads {expected}, which deploy/k8s does not define"


def test_every_container_reading_the_configmap_reads_the_secret_after_it() -> None:
    """The Secret is where a broker URL with its password goes, overriding the ConfigMap's: a
    backfill Job that read the ConfigMap alone sent to a Redis without the password (or to the
    in-cluster one a managed Redis replaced) while the workers used the Secret's."""
    readers = 0
    for path, obj in _k8s_objects():
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        if obj.get("kind") == "CronJob":
            pod = obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        for container in pod.get("containers", []):
            sources = [next(iter(s.items())) for s in container.get("envFrom", [])]
            names = [(kind, ref["name"]) for kind, ref in sources]
            if ("configMapRef", "tracescore-config") not in names:
                continue
            readers += 1
            assert ("secretRef", "tracescore-judge-keys") in names, f"{path.name}: {container['name']} reads no Secret"
            secret_at = names.index(("secretRef", "tracescore-judge-keys"))
            assert secret_at > names.index(("configMapRef", "tracescore-config")), f"{path.name}: Secret first"
    assert readers >= 3  # the workers and the two backfill Jobs


def test_the_keda_scaler_reads_its_password_from_a_key_the_secret_documents() -> None:
    """KEDA cannot read a password out of TRACESCORE_BROKER_URL: the ScaledObject's guidance
    names a Secret key, which the Secret's template documents (it named a variable no container
    had)."""
    keda = (K8S / "keda-scaledobject.yaml").read_text(encoding="utf-8")
    secret = (K8S / "secret.example.yaml").read_text(encoding="utf-8")
    keys = re.findall(r"key: ([A-Z_]+)", keda)
    assert keys == ["REDIS_PASSWORD"]
    assert all(f"{k}:" in secret for k in keys)
    assert "passwordFromEnv" not in keda


def test_kustomize_builds() -> None:
    """`kubectl kustomize deploy/k8s` renders the worker Deployment into the tracescore namespace.
    CI installs kubectl (tests/integration/servers.sh: Debian's kubernetes-client); there
    (TRACESCORE_REQUIRE_SERVERS=1) a missing kubectl fails instead of skipping."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        message = "kubectl is not installed (Debian: apt-get install kubernetes-client)"
        if os.environ.get("TRACESCORE_REQUIRE_SERVERS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    objects = [d for d in yaml.safe_load_all(out) if d]
    worker = next(d for d in objects if d["kind"] == "Deployment")
    assert worker["metadata"]["namespace"] == "tracescore"
    assert not [d for d in objects if d["kind"] in {"Secret", "ScaledObject", "Job"}]


def test_deploy_paths_named_in_the_deploy_files_and_the_readme_exist() -> None:
    """Every deploy/... path a file in deploy/ or the README names exists, but for the files a
    `cp` (or "Copy to") in the same text creates and `kubectl ... deploy/<the Deployment>` (the
    alert rules said Prometheus loads them from deploy/prometheus.yml, which is
    deploy/prometheus/prometheus.yml)."""
    deployment = _one("Deployment", "tracescore-worker")["metadata"]["name"]
    checked = 0
    for path in [*_deploy_files(), ROOT / "README.md"]:
        if path.suffix in {".json", ".gz"}:
            continue
        text = path.read_text(encoding="utf-8")
        created = set(re.findall(r"(?:\bcp\s+\S+|\b[Cc]opy to)\s+deploy/([\w./-]*\w)", text))
        for name in re.findall(r"(?<![\w/.-])deploy/([\w./-]*\w)", text):
            if name == deployment or name in created:
                continue
            assert (DEPLOY / name).exists(), f"{path.relative_to(ROOT)} names deploy/{name}, which does not exist"
            checked += 1
    assert checked >= 20


def test_deploy_comments_name_the_health_checks_the_deploy_files_run() -> None:
    """A comment or doc in deploy/ that says how the worker's health is checked names a command
    the compose healthcheck or a Kubernetes probe really runs (the probes moved from `celery
    inspect ping` to `tracescore probe`; the Dockerfile kept saying the old one)."""
    run: set[str] = set()
    container = _one("Deployment", "tracescore-worker")["spec"]["template"]["spec"]["containers"][0]
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        run.add(" ".join(container[probe]["exec"]["command"][:3]))
    run.add(" ".join(_compose()["services"]["worker"]["healthcheck"]["test"][1:4]))
    for path in _deploy_files():
        if path.suffix in {".json", ".gz"}:
            continue
        text = path.read_text(encoding="utf-8")
        assert "inspect ping" not in text or any("inspect ping" in r for r in run), path
        for verb in re.findall(r"tracescore probe ([a-z]+)", text):
            assert f"tracescore probe {verb}" in run, (path, verb)
