#!/usr/bin/env bash
# The single test command (README "Test" section and .ci/run): bootstrap .venv, run pytest.
# Extra arguments go to pytest, e.g. hack/test.sh -k code_quality -x
set -euo pipefail

# shellcheck source=hack/lib/venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/venv.sh"
# shellcheck source=hack/lib/system.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/system.sh"
ensure_venv dev
ensure_system_packages

cd "${REPO_ROOT}"
rc=0
"${VENV}/bin/python" -m pytest "$@" || rc=$?
if [[ ${rc} -eq 5 ]]; then
    echo "hack/test.sh: pytest collected no tests (exit 5); treating as success." >&2
    exit 0
fi
exit "${rc}"
