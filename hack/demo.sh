#!/usr/bin/env bash
# The whole method on this machine, no cluster needed: a local Triton serving rag-sim, the
# COMPASS-V search through it, profiling, planning, and Elastico against a load spike.
# Extra arguments go to `compass demo` (`--search-only`: the search alone, seconds, no Triton;
# `--cluster`: through the operator on a local control plane, from the development tools).
set -euo pipefail

# shellcheck source=hack/lib/venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/venv.sh"
# [local]: the tritonserver binary and Python backend from NVIDIA's PyTriton wheel. --cluster
# runs the development tools (dev/compass_dev), which `ensure_venv dev` installs with [local].
if [[ " $* " == *" --cluster "* ]]; then
    ensure_venv dev
else
    ensure_venv local
fi

cd "${REPO_ROOT}"
exec "${VENV}/bin/compass" demo "$@"
