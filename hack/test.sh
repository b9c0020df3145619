#!/usr/bin/env bash
# The single test command (README "Test" section and .ci/run): bootstrap .venv, run pytest.
# Extra arguments go to pytest, e.g. hack/test.sh -k code_quality -x
# COMPASS_REQUIRE_TIERS=1 (.ci/run sets it): a tier whose servers cannot start here fails with
# the reason instead of skipping (tests/tiers.py).
set -euo pipefail

# shellcheck source=hack/lib/venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/venv.sh"
# shellcheck source=hack/lib/system.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/system.sh"
ensure_venv dev
ensure_system_packages
# The k8s tier's control plane (tests/k8s): built once from Debian's kubernetes source package
# (minutes), then cached (seconds). Its exit status tells tests/k8s whether the tier is
# unavailable here (3: cannot build on this machine; skip, or fail under COMPASS_REQUIRE_TIERS=1)
# or broken (anything else: fail). COMPASS_K8S_BUILD=0 leaves it to the fixture.
if [[ "${COMPASS_K8S_BUILD:-1}" != "0" ]]; then
    k8s_rc=0
    k8s_log="$(mktemp)"
    # Its progress still reaches stderr; the copy keeps its last line, the reason for an exit 3,
    # so that the tier's skip or failure names it.
    # shellcheck disable=SC2069  # on purpose: stderr into the pipe, stdout (the path) dropped
    "${REPO_ROOT}/hack/k8s/build.sh" 2>&1 >/dev/null | tee "${k8s_log}" >&2 \
        || k8s_rc=${PIPESTATUS[0]}
    export COMPASS_K8S_BUILD_RC="${k8s_rc}"
    COMPASS_K8S_BUILD_REASON="$(tail -n 1 "${k8s_log}")"
    export COMPASS_K8S_BUILD_REASON
    rm -f "${k8s_log}"
fi

cd "${REPO_ROOT}"
rc=0
"${VENV}/bin/python" -m pytest "$@" || rc=$?
if [[ ${rc} -eq 5 ]]; then
    # Never a success: a run that tested nothing must not go green (CI runs no -k; a -k or path
    # of yours that selects nothing is a mistake worth a red exit too).
    echo "hack/test.sh: pytest collected no tests (exit 5): nothing was tested." >&2
fi
exit "${rc}"
