#!/usr/bin/env bash
# Regenerate the CRD YAML from the pydantic models into crds/ and into the Helm chart's crds/
# (tests/unit/test_crds.py fails while either copy is stale). Extra arguments go to
# `compass crds`, e.g. hack/gen-crds.sh --check
set -euo pipefail

# shellcheck source=hack/lib/venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/venv.sh"
ensure_venv
cd "${REPO_ROOT}"
for dir in crds charts/compass-operator/crds; do
    "${VENV}/bin/compass" crds --output-dir "${dir}" "$@"
done
