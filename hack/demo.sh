#!/usr/bin/env bash
# Run the COMPASS-V search on an embedded example; no cluster needed.
# Extra arguments go to `compass demo`.
set -euo pipefail

# shellcheck source=hack/lib/venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/venv.sh"
ensure_venv

cd "${REPO_ROOT}"
exec "${VENV}/bin/compass" demo "$@"
