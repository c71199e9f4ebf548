#!/usr/bin/env bash
# Create ./.venv and install burst with everything its tests need. Safe to re-run.
# torch is pinned first: on these machines `torch==2.13.0` is a local CPU wheel, while an
# unpinned requirement could pull a multi-GB CUDA build. pyproject keeps a range for users.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -e ".[test,cloud,gcs,docs]"
