#!/usr/bin/env bash
# The main job on the embedded default (a local store, no GPU, no cloud account):
# train a small model, kill it mid-run with SIGKILL, resume it, and show that the
# resumed run ends bit-identical to one that never stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/burst ] || bash scripts/setup.sh
exec .venv/bin/python scripts/demo.py "$@"
