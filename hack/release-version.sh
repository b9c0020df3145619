#!/usr/bin/env bash
# Print the version a release publishes, after checking that every place naming it agrees:
# pyproject.toml's version, compass.__version__, the chart's version and appVersion, and the
# tag when one is given (v0.1.0 for 0.1.0). A mismatch exits 1 naming the file to fix.
#   hack/release-version.sh            # the version, checked across the files
#   hack/release-version.sh v0.1.0     # ... and equal to the tag
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# The first line `KEY = "VALUE"` or `KEY: "VALUE"` of a file, quotes dropped.
field() {
  local file="$1" pattern="$2"
  sed -n -E "s/${pattern}[[:space:]]*[=:][[:space:]]*\"?([^\"[:space:]]+)\"?.*/\\1/p" \
    "${REPO_ROOT}/${file}" | head -n 1
}

version="$(field pyproject.toml '^version')"
if [[ -z "${version}" ]]; then
  echo "pyproject.toml: no version line" >&2
  exit 1
fi
declare -A found=(
  ["operator/compass/__init__.py __version__"]="$(field operator/compass/__init__.py '^__version__')"
  ["charts/compass-operator/Chart.yaml version"]="$(field charts/compass-operator/Chart.yaml '^version')"
  ["charts/compass-operator/Chart.yaml appVersion"]="$(field charts/compass-operator/Chart.yaml '^appVersion')"
)
status=0
for where in "${!found[@]}"; do
  if [[ "${found[${where}]}" != "${version}" ]]; then
    echo "${where} is '${found[${where}]}', pyproject.toml's version is '${version}': make them equal" >&2
    status=1
  fi
done
if [[ $# -gt 0 && "$1" != "v${version}" ]]; then
  echo "tag '$1' is not v${version} (pyproject.toml, the chart): tag v${version}, or bump the version in all of them" >&2
  status=1
fi
if [[ ${status} -ne 0 ]]; then
  exit "${status}"
fi
echo "${version}"
