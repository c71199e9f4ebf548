#!/usr/bin/env bash
# The main job on the embedded default (a local store, no GPU, no cloud account):
# train the address-matching example, inject a CUDA OOM, resume it (agent retry and
# the local launcher), and compare with a run that never stopped (scripts/demo.py).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/burst ] || bash scripts/setup.sh
exec .venv/bin/python scripts/demo.py "$@"
