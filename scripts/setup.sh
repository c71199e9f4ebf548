#!/usr/bin/env bash
# Create ./.venv and install burst with everything its tests need; SkyPilot goes into its
# own ./.venv-sky, as a user installs it (uv tool install skypilot==0.14.1): it pins
# click<8.2, which the training environment's current transformers cannot live with.
# burst finds it through $BURST_SKYPILOT_PYTHON (tests/conftest.py points there). Safe to
# re-run. torch is pinned first: on these machines `torch==2.13.0` is a local CPU wheel,
# while an unpinned requirement could pull a multi-GB CUDA build. pyproject keeps a range.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" "torch==2.13.0"
if .venv/bin/python -c "import sky" 2>/dev/null; then  # an older setup put it here
  .venv/bin/python -m pip uninstall --quiet -y skypilot
fi
"${PIP[@]}" -e ".[test,gcs,docs]"
if [ ! -x .venv-sky/bin/python ]; then
  "$PY" -m venv .venv-sky
fi
.venv-sky/bin/python -m pip install --quiet --disable-pip-version-check "skypilot==0.14.1"
