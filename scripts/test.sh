#!/usr/bin/env bash
# Install everything and run the whole test suite (what CI runs: .ci/run calls this).
# The tests start their own servers on 127.0.0.1 (an S3-compatible server, OpenSSH);
# this script only makes sure the programs exist.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if ! command -v sshd >/dev/null 2>&1 && [ ! -x /usr/sbin/sshd ]; then
  echo "installing openssh-server for the SFTP tests" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq openssh-server >/dev/null
fi
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  echo "installing prometheus for the metrics tests" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq prometheus >/dev/null
  # the package starts a service on :9090; the tests start their own on free ports
  service prometheus stop >/dev/null 2>&1 || true
fi
# the sealed node of another distribution (tests/helpers/node_world.py): debootstrap builds a Debian
# 13 root, and a standalone CPython 3.11 is built from Debian's source package, both once,
# cached under ~/.cache/burst-tests ($BURST_TEST_CACHE)
NODE_WORLD=(debootstrap build-essential libssl-dev zlib1g-dev libffi-dev libbz2-dev
            liblzma-dev libsqlite3-dev libreadline-dev)
missing=()
for package in "${NODE_WORLD[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]} for the sealed node of another distribution" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# built here, where the network is allowed, never inside a test
.venv/bin/python -m tests.helpers.node_world
# the suite's sealed nodes write several GB of temporaries: CI starts on a machine where
# earlier runs may have left theirs, so a CI run clears them and says how much room is left
if [ "${CI:-}" = "true" ]; then
  rm -rf "${TMPDIR:-/tmp}/pytest-of-$(id -un)"
fi
echo "free for temporaries: $(df -h --output=avail "${TMPDIR:-/tmp}" | tail -n 1 | tr -d ' ')" >&2
.venv/bin/ruff check burst tests scripts
# burst runs on Python 3.10 too (a cloud node's Ubuntu 22.04): no newer stdlib in the package
.venv/bin/vermin --quiet --no-tips --violations --eval-annotations --target=3.10- burst scripts
# burst's type hints are checked (py.typed promises them to users): [tool.mypy] in pyproject.toml
.venv/bin/mypy burst
# arguments: run just those tests, as pytest would
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
# Two lanes. The fast lane (everything but the end-to-end tests) runs in parallel, a test
# file per worker at a time (its module's servers and fixtures stay in one process); most
# of its time is spent waiting on servers and subprocesses, so one worker more than cores.
# The end-to-end lane follows, two files at a time: each trains in real processes.
cores=$(nproc)
fast_workers=${BURST_TEST_WORKERS:-$((cores + 1))}
e2e_workers=${BURST_E2E_WORKERS:-$(( cores < 2 ? 1 : 2 ))}
lane() {  # lane NAME WORKERS PYTEST-ARGS...: runs it, says how long it took
  local name=$1 workers=$2 started=$SECONDS status=0
  shift 2
  echo "== $name lane: $workers workers ==" >&2
  .venv/bin/python -m pytest -n "$workers" --dist loadfile "$@" || status=$?
  echo "== $name lane: exit $status after $((SECONDS - started)) s ==" >&2
  return "$status"
}
status=0
lane fast "$fast_workers" -m "not e2e" || status=$?
lane e2e "$e2e_workers" -m e2e || status=$?
exit "$status"
