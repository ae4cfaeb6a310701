"""The packages load their public names on first use (``lazy_loader`` over each ``__init__.pyi``):
every name still resolves, type checkers see the same names, and a probe of the command line
loads neither the Celery app nor the scorers' models."""

from __future__ import annotations

import ast
import importlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests._redis import RedisServer

ROOT = Path(__file__).resolve().parent.parent
LAZY = ["scorers", "tracing", "tracing.queue", "tracing.sinks", "tracing.sources", "worker", "worker.backfill"]


def _stub_all(package: str) -> set[str]:
    """The ``__all__`` a package's ``__init__.pyi`` declares: what mypy exports (a stub's own imports
    are not re-exported without it)."""
    stub = ROOT / package.replace(".", "/") / "__init__.pyi"
    names: set[str] = set()
    for node in ast.parse(stub.read_text()).body:
        if not isinstance(node, ast.Assign | ast.AugAssign):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert isinstance(node.value, ast.List), f"{stub}: __all__ must be a list literal"
            names |= {ast.literal_eval(e) for e in node.value.elts}
    return names


@pytest.mark.parametrize("package", LAZY)
def test_every_exported_name_resolves_and_type_checkers_see_the_same_names(package: str) -> None:
    module = importlib.import_module(package)
    exported = set(module.__all__)
    assert exported == _stub_all(package), f"{package}: runtime __all__ and __init__.pyi's __all__ differ"
    for name in sorted(exported):
        assert getattr(module, name) is not None, f"{package}.{name}"
    assert exported <= set(dir(module))
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018


def test_subpackages_are_attributes_of_their_package_as_before() -> None:
    """``import tracing`` then ``tracing.sinks.X`` worked when the package imported everything; it
    still does, each subpackage imported on first use."""
    code = (
        "import sys, scorers, tracing, worker\n"
        "assert 'tracing.sinks' not in sys.modules\n"
        "print(tracing.sinks.PhoenixSink.__name__, scorers.judge.JudgeModel.__name__,\n"
        "      worker.store.ScoreStore.__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["PhoenixSink", "JudgeModel", "ScoreStore"], done.stderr[-2000:]


def test_the_old_writer_names_are_the_sinks() -> None:
    import tracing

    assert tracing.ConsoleScoreWriter is tracing.ConsoleSink
    assert tracing.JsonlScoreWriter is tracing.JsonlSink
    assert tracing.MemoryScoreWriter is tracing.MemorySink


# What a probe must not load: the Celery app, the scorers' models and judges, the exporter, the
# sinks and the readers (over a second of CPU each call, in every worker pod every 15 s).
HEAVY = [
    "worker._app",
    "worker._scoring",
    "scorers.agent",
    "scorers.judge",
    "tracing.capture",
    "tracing.sinks",
    "tracing.otlp",
    "tracing.queue._contract",
    "openai",
    "anthropic",
]


def _loaded_after(
    argv: list[str], modules: list[str], env: dict[str, str] | None = None, timeout: float = 60
) -> tuple[int, list[str], str]:
    """Run ``tracescore argv`` in a fresh interpreter: its exit code, which of ``modules`` it
    loaded, and its stderr."""
    code = (
        "import json, sys\n"
        "from worker.cli import main\n"
        f"code = main({argv!r})\n"
        f"print(json.dumps([code, sorted(m for m in {modules!r} if m in sys.modules)]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-2000:]  # (main returns its exit code: the interpreter ends 0)
    exit_code, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    return exit_code, loaded, done.stderr


@pytest.mark.parametrize("probe", ["live", "ready"])
def test_a_probe_loads_neither_the_celery_app_nor_the_scorers(probe: str, tmp_path: Path) -> None:
    broker = ["--broker", "redis://127.0.0.1:1/0"] if probe == "ready" else []
    code_, loaded, stderr = _loaded_after(["probe", probe, "--dir", str(tmp_path), *broker], HEAVY)
    assert code_ == 1  # no worker wrote its files there: not live, not ready
    assert "not live" in stderr or "not ready" in stderr
    assert loaded == []


@pytest.mark.parametrize("argv", [["--version"], ["probe", "live"]], ids=["version", "probe-live"])
def test_a_command_that_talks_to_no_broker_loads_no_redis_client_and_no_celery(argv: list[str], tmp_path: Path) -> None:
    """A liveness probe runs every few seconds in every worker container: what it loads is paid
    each time. The settings and the error tree it reads stay clear of redis-py, Celery and kombu."""
    if argv[0] == "probe":
        argv = [*argv, "--dir", str(tmp_path)]
    code_, loaded, stderr = _loaded_after(argv, ["redis", "celery", "kombu"])
    assert code_ == (1 if argv[0] == "probe" else 0), stderr
    assert loaded == []


@pytest.mark.parametrize("given", ["flag", "variable"])
def test_a_liveness_probe_loads_no_settings_and_no_pydantic(given: str, tmp_path: Path) -> None:
    """`probe live` reads its directory from --dir or TRACESCORE_PROBE_DIR without the worker's
    settings, and looks up no version: loading them (pydantic, pydantic-settings,
    importlib.metadata) was two thirds of its CPU, paid every 30 s in every pod (bench/cli.py)."""
    argv, env = ["probe", "live"], dict(os.environ)
    if given == "flag":
        argv += ["--dir", str(tmp_path)]
        env.pop("TRACESCORE_PROBE_DIR", None)
    else:
        env["TRACESCORE_PROBE_DIR"] = str(tmp_path)
    unwanted = ["pydantic", "pydantic_settings", "worker._settings", "asyncio", "importlib.metadata"]
    code_, loaded, stderr = _loaded_after(argv, unwanted, env)
    assert code_ == 1  # no worker wrote its files there
    assert f"not live: no consumer heartbeat in {tmp_path}" in stderr
    assert loaded == []


def test_a_backfill_sent_to_redis_loads_no_scoring_code_and_no_unused_sink(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """The workers score; the job that sends them traces reads, plans and publishes. It loads
    neither the scoring module nor the Celery app nor a sink it was not given (their import is a
    quarter of the job's start-up CPU)."""
    from tests.backfill._synth import write_otlp_files

    data = write_otlp_files(tmp_path / "traces", 20, files=1, traces_per_line=20)[0]
    unwanted = ["worker._scoring", "worker._app", "worker._delivery", "tracing.sinks._otlp", "tracing.sinks._phoenix"]
    argv = ["backfill", str(data), "--scorers", "bench.backfill_scorers", "--no-wait", "--json"]
    client = redis_server.client(9)
    client.flushdb()
    try:
        env = {**os.environ, "TRACESCORE_BROKER_URL": redis_server.url(9), "TRACESCORE_SINKS": "otlp"}
        code_, loaded, stderr = _loaded_after(argv, unwanted, env=env, timeout=120)
        assert code_ == 0, stderr[-2000:]
        assert client.llen("tracescore") >= 1  # the runs were sent
    finally:
        client.flushdb()
        client.close()
    assert loaded == []


def test_status_reads_the_jobs_states_without_loading_the_backfill(redis_server: RedisServer) -> None:
    """`status` is a health check, run every few seconds: it reads each backfill job's state
    (``BackfillState``) without loading the driver, the job, the sources' Tempo client (httpx)
    or the protobuf decoder (a quarter of a second each call, when the backfill package imported
    them all)."""
    from worker.backfill._state import BackfillOptions, BackfillState, RedisJobStore

    client = redis_server.client(9)
    client.flushdb()
    try:
        options = BackfillOptions(scorers_module="bench.backfill_scorers", scorer_ids=["plain"])
        state = BackfillState(job_id="bf-lazy-1", source={"kind": "files", "files": []}, options=options)
        assert RedisJobStore(client).save(state)
        unwanted = ["httpx", "google.protobuf", "worker.backfill._driver", "worker.backfill._job"]
        env = {**os.environ, "TRACESCORE_BROKER_URL": redis_server.url(9)}
        code_, loaded, stderr = _loaded_after(["status", "--json"], unwanted, env=env)
        assert code_ == 0, stderr[-2000:]
    finally:
        client.flushdb()
        client.close()
    assert loaded == []


def test_the_built_wheel_carries_the_stubs_its_packages_load_names_from(tmp_path: Path) -> None:
    """The stubs are read at import: a wheel without them (package data) could not import a package.
    Built from what the Dockerfile copies, as its ``pip install .`` builds it (in a copy: an
    in-tree build leaves a build/ whose stale files could stand in for missing ones), then
    imported from the unpacked wheel."""
    source = tmp_path / "source"
    for name in ("scorers", "tracing", "worker"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-build-isolation",  # the venv's setuptools (dev extra): no package registry in a test
            "-w",
            str(tmp_path),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("tracescore-*.whl")
    unpacked = tmp_path / "unpacked"
    with zipfile.ZipFile(wheel) as archive:
        assert {f"{p.replace('.', '/')}/__init__.pyi" for p in LAZY} <= set(archive.namelist())
        archive.extractall(unpacked)
    code = (
        "import importlib, sys\n"
        f"for name in {LAZY!r}:\n"
        "    module = importlib.import_module(name)\n"
        f"    assert module.__file__.startswith({str(unpacked)!r}), module.__file__\n"
        "    for export in module.__all__:\n"
        "        getattr(module, export)\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(unpacked)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.strip() == "ok", done.stderr[-2000:]
