#!/usr/bin/env bash
# Regenerate the CRD YAML from the pydantic models into crds/, the Helm chart's CRD templates
# (templates/crds/) and the markdown reference docs/crd-reference.md (tests/repo/test_crds.py
# and tests/repo/test_crd_reference.py fail while any is stale). Extra arguments go to
# `compass crds`, e.g. hack/gen-crds.sh --check
set -euo pipefail

# shellcheck source=hack/lib/venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/venv.sh"
ensure_venv
cd "${REPO_ROOT}"
"${VENV}/bin/compass" crds --output-dir crds --reference docs/crd-reference.md "$@"
# The chart installs and upgrades the CRDs as templates (Helm never upgrades a chart's crds/),
# behind crds.install and crds.keep, with the CEL rules only where the API server knows them.
mkdir -p charts/compass-operator/templates/crds
"${VENV}/bin/compass" crds --helm-template --output-dir charts/compass-operator/templates/crds "$@"
