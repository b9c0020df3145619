#!/usr/bin/env bash
# The whole method on this machine, no cluster needed: a local Triton serving rag-sim, the
# COMPASS-V search through it, profiling, planning, and Elastico against a load spike.
# Extra arguments go to `compass demo` (`--search-only`: the search alone, seconds, no Triton).
set -euo pipefail

# shellcheck source=hack/lib/venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/venv.sh"
# [local]: the tritonserver binary and Python backend from NVIDIA's PyTriton wheel.
ensure_venv local

cd "${REPO_ROOT}"
exec "${VENV}/bin/compass" demo "$@"
