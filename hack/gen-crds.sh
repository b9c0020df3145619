#!/usr/bin/env bash
# Regenerate the CRD YAML from the pydantic models into crds/ and into the Helm chart's crds/,
# and the markdown reference docs/crd-reference.md (tests/unit/test_crds.py and
# tests/unit/test_crd_reference.py fail while any is stale). Extra arguments go to
# `compass crds`, e.g. hack/gen-crds.sh --check
set -euo pipefail

# shellcheck source=hack/lib/venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/venv.sh"
ensure_venv
cd "${REPO_ROOT}"
"${VENV}/bin/compass" crds --output-dir crds --reference docs/crd-reference.md "$@"
# The chart's copy leaves the CEL rules out: Helm 4 installs crds/ with server-side apply, which
# a Kubernetes < 1.25 API server refuses for x-kubernetes-validations (the operator checks the
# same rules; crds/ keeps them for current servers).
"${VENV}/bin/compass" crds --without-cel --output-dir charts/compass-operator/crds "$@"
