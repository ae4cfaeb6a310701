"""tracing/_sdk.py: private SDK fields only on a tested SDK version, the public API otherwise,
the same records either way, on the oldest and the newest SDK the project allows; and the OTLP
sink reading every answer alike on the oldest and the newest OTLP exporter."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan

import tracing._sdk as sdk
from tests.tracing._capture_sdk_check import check, make_spans
from tests.tracing._otlp_sink_check import check as check_otlp_sink
from tracing._records import span_record

ROOT = Path(__file__).resolve().parents[2]
OLDEST = "1.27.0"


def _pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {d.split(">")[0]: d for d in deps if d.startswith(("opentelemetry-api", "opentelemetry-sdk"))}


def test_tested_range_is_the_pyproject_pin() -> None:
    """TESTED_SDK's bounds are pyproject's: >= oldest minor, < the minor after the newest."""
    (lo_major, lo_minor), (hi_major, hi_minor) = sdk.TESTED_SDK
    for name, spec in _pins().items():
        assert f">={lo_major}.{lo_minor}" in spec, (name, spec)
        assert f"<{hi_major}.{hi_minor + 1}" in spec, (name, spec)
    assert OLDEST.startswith(f"{lo_major}.{lo_minor}.")


def test_newest_installed_sdk_takes_the_fast_path_and_matches_the_public_api() -> None:
    """The installed SDK is in the tested range: fast path on, same records as the public API."""
    version = sdk.sdk_version()
    assert version is not None
    assert sdk.TESTED_SDK[0] <= version <= sdk.TESTED_SDK[1]
    summary = check()
    assert summary["fast_path"] is True
    assert [r["name"] for r in summary["records"]] == ["chat m", "invoke_agent a"]


def test_an_sdk_outside_the_tested_range_reads_the_public_api(monkeypatch: pytest.MonkeyPatch) -> None:
    """A newer (or unknown) SDK version turns the private-field path off."""
    monkeypatch.setattr(sdk, "sdk_version", lambda: (sdk.TESTED_SDK[1][0], sdk.TESTED_SDK[1][1] + 1))
    assert sdk._fast_path_allowed() is False
    monkeypatch.setattr(sdk, "sdk_version", lambda: None)
    assert sdk._fast_path_allowed() is False
    monkeypatch.setattr(sdk, "sdk_version", lambda: sdk.TESTED_SDK[0])
    assert sdk._fast_path_allowed() is True


def test_a_changed_span_layout_fails_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """In range but the private fields moved: the probe says no, the public API is read."""
    monkeypatch.setattr(sdk, "_FIELDS", lambda span: (None,) * 11)
    assert sdk._probe() is False
    assert sdk._fast_path_allowed() is False


def test_a_subclass_is_read_through_its_properties() -> None:
    """A ReadableSpan subclass may override properties: they are what is read, not the fields."""
    (span, *_) = make_spans()

    class Renamed(ReadableSpan):
        @property
        def name(self) -> str:
            return "renamed"

    sub = Renamed(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=span.attributes,
        events=span.events,
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )
    assert span_record(sub).name == "renamed"
    assert span_record(span).name == span.name


def _oldest_sdk(cache: Path) -> Path:
    target = cache / f"otel-{OLDEST}-with-exporter"
    done = target / ".installed"
    if done.exists():
        return target
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--target",
            str(target),
            f"opentelemetry-api=={OLDEST}",
            f"opentelemetry-sdk=={OLDEST}",
            f"opentelemetry-exporter-otlp-proto-http=={OLDEST}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        if re.search(r"connect|network|resolve|timed out|unreachable|No matching distribution", proc.stderr, re.I):
            pytest.skip(f"cannot install opentelemetry-sdk=={OLDEST} (package registry unreachable?): {last}")
        pytest.fail(f"pip install opentelemetry-sdk=={OLDEST} failed: {last}")
    done.touch()
    return target


def _on_oldest(pytestconfig: pytest.Config, module: str) -> dict[str, Any]:
    """What ``python -m module`` prints (its last line, JSON) with the oldest allowed SDK and
    OTLP exporter first on the path."""
    target = _oldest_sdk(Path(pytestconfig.cache.mkdir("tracescore-sdk")))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "-m", module],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    said: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return said


def test_oldest_allowed_sdk_gives_the_same_records(pytestconfig: pytest.Config) -> None:
    """On opentelemetry-sdk 1.27.0 (a subprocess, that SDK first on the path): fast path on,
    fast == public, and the records equal the newest SDK's."""
    old = _on_oldest(pytestconfig, "tests.tracing._capture_sdk_check")
    assert old["sdk"] == OLDEST
    assert old["fast_path"] is True
    assert old["records"] == check()["records"]


def test_fast_and_public_paths_agree_on_a_span_without_attributes_or_events() -> None:
    """Empty attributes and no events read alike on both paths."""
    from opentelemetry.trace import SpanContext

    span = ReadableSpan(name="bare", context=SpanContext(1, 2, is_remote=False), start_time=1, end_time=2)
    fast = span_record(span)
    on = sdk.FAST_PATH
    sdk.FAST_PATH = False
    try:
        public = span_record(span)
    finally:
        sdk.FAST_PATH = on
    assert fast == public
    assert (fast.attributes, fast.events) == ({}, ())


def _expected_otlp_answers(said: dict[str, Any]) -> None:
    outcomes = said["outcomes"]
    assert outcomes["accepted"] == {"outcome": "Delivered"}
    assert outcomes["refused"] == {
        "outcome": "Refused",
        "reason": "otlp_http_400",
        "detail": "missing header x-mlflow-experiment-id",
    }
    # The oldest exporter posts with requests' default and followed the redirect: stored
    # elsewhere (or not at all), and called delivered.
    assert outcomes["redirected"]["outcome"] == "Refused"
    assert outcomes["redirected"]["reason"] == "otlp_http_308"
    # Cut at the exchange's deadline, named alike whether the exporter let it raise (the oldest)
    # or reported a failure (the newest): before, a status line dripped within each read's
    # timeout was waited out.
    assert outcomes["dripped_headers"] == {
        "outcome": "Retry",
        "reason": "OTLP endpoint: the answer was not finished within 2 s",
    }
    assert outcomes["accepted_after"] == {"outcome": "Delivered"}
    assert said["paths"] == ["/v1/traces"] * 5


def test_otlp_sink_reads_each_answer_alike_on_the_newest_exporter() -> None:
    _expected_otlp_answers(check_otlp_sink())


def test_otlp_sink_reads_each_answer_alike_on_the_oldest_exporter(pytestconfig: pytest.Config) -> None:
    """On opentelemetry-exporter-otlp-proto-http 1.27.0, which passes ``verify`` and ``cert``
    per request and follows redirects unless told not to (the newest: on its session, never)."""
    old = _on_oldest(pytestconfig, "tests.tracing._otlp_sink_check")
    assert old["exporter"] == OLDEST
    _expected_otlp_answers(old)
