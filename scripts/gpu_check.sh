#!/usr/bin/env bash
# The GPU-only checks (pytest -m gpu, tests/gpu/) on a machine with a CUDA card, in under
# 8 minutes: real CUDA OOMs (forward, optimizer.step) with the snapshot and the agent's
# retry, the in-process memory re-plan under a capped allocator, NVML readings, bf16/fp16 +
# GradScaler resume exactness, and the CUDA RNG restore. Without a usable GPU it says so and
# fails, rather than "passing" with every test skipped.
#   scripts/gpu_check.sh            set up .venv (scripts/setup.sh), then run the checks
#   SKIP_SETUP=1 scripts/gpu_check.sh   use the existing .venv as it is
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SKIP_SETUP:-0}" != "1" ]; then
  scripts/setup.sh
fi
PY=.venv/bin/python
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: torch $("$PY" -c 'import torch; print(torch.__version__)') sees no CUDA device; nothing checked" >&2
  exit 2
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "on", torch.cuda.get_device_name())'
exec timeout 480 "$PY" -m pytest tests/gpu -m gpu -q -p no:cacheprovider -rs --timeout 240 "$@"
