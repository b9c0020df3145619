#!/usr/bin/env bash
# The whole method on this machine, no cluster needed: a local Triton serving rag-sim, the
# COMPASS-V search through it, profiling, planning, and Elastico against a load spike.
# Extra arguments go to `compass demo` (`--search-only`: the search alone, seconds, no Triton;
# `--cluster`: through the operator on a local control plane).
set -euo pipefail

# shellcheck source=hack/lib/venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/venv.sh"
# The demo runs from the development tools (dev/compass_dev: the local Triton, the experiment,
# the local control plane), which `ensure_venv demo` installs with the [local] extra (the
# tritonserver binary and Python backend from NVIDIA's PyTriton wheel); --cluster as the tests
# run it, with the [dev] extra too.
if [[ " $* " == *" --cluster "* ]]; then
    ensure_venv dev
else
    ensure_venv demo
fi

cd "${REPO_ROOT}"
exec "${VENV}/bin/compass" demo "$@"
