#!/usr/bin/env bash
# Installs the dashboard servers the integration tests start, each in its own venv under
# .venv-servers/ (re-installed only when its requirements file changes), and Debian's chromium
# for the browser test, and Debian's prometheus. Called by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/../.."

for name in phoenix mlflow; do
  req="tests/integration/requirements-$name.txt"
  venv=".venv-servers/$name"
  stamp="$venv/.requirements.sha256"
  want="$(sha256sum "$req" | cut -d' ' -f1)"
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "installing the $name server into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
    echo "$want" > "$stamp"
  fi
done

# Debian's prometheus: promtool checks the alert rules, a real Prometheus runs the worker
# dashboard's queries against a real worker (tests/deploy/test_worker_dashboard.py).
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
  echo "prometheus is missing: installing Debian's package"
  apt-get update -qq && apt-get install -y -qq prometheus >/dev/null
fi

# Debian's kubernetes-client: kubectl kustomize renders deploy/k8s (tests/deploy/test_deploy_files.py).
if ! command -v kubectl >/dev/null; then
  echo "kubectl is missing: installing Debian's kubernetes-client"
  apt-get update -qq && apt-get install -y -qq kubernetes-client >/dev/null
fi

if ! command -v chromium >/dev/null; then
  echo "chromium is missing: installing Debian's package (for the headless browser test)"
  apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
