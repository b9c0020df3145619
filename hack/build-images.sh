#!/usr/bin/env bash
# Build every image of the project and push them, with the Helm chart, to a registry of your own
# (an air-gapped cluster's, or a mirror): what .github/workflows/release.yml publishes to
# ghcr.io/compass-operator, under another name.
#
#   hack/build-images.sh REGISTRY [TAG]
#
#   REGISTRY   where to push, e.g. registry.internal:5000/compass: the images become
#              REGISTRY/compass-operator:TAG, REGISTRY/compass-rag-sim:TAG and
#              REGISTRY/compass-qa-real:TAG, the chart oci://REGISTRY/charts/compass-operator
#   TAG        the images' tag (default: the project's version, hack/release-version.sh)
#
# Environment:
#   PLATFORMS  platforms to build, comma-separated (default linux/amd64; the release builds
#              linux/amd64,linux/arm64, which needs QEMU binfmt on an amd64 host)
#   BUILDER    docker (docker buildx) or podman (default: docker if found, else podman)
#
# Run it where the base images (python, nvcr.io/nvidia/tritonserver) and the package indexes can
# be reached and the registry too; log in to the registry first (docker login / podman login,
# and helm registry login for the chart). It prints the helm install line for that registry.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# name, build context, Dockerfile (relative to the repository root): the release's matrix.
IMAGES=(
  "compass-operator . model-images/operator/Dockerfile"
  "compass-rag-sim . model-images/rag-sim/Dockerfile"
  "compass-qa-real . model-images/qa-real/Dockerfile"
)

usage() {
  echo "usage: hack/build-images.sh REGISTRY [TAG]  (e.g. registry.internal:5000/compass)" >&2
  exit 2
}

if [[ $# -lt 1 || $# -gt 2 || -z "$1" || "$1" == -* ]]; then
  usage
fi
registry="${1%/}"
version="$("${REPO_ROOT}/hack/release-version.sh")"
tag="${2:-${version}}"
platforms="${PLATFORMS:-linux/amd64}"

builder="${BUILDER:-}"
if [[ -z "${builder}" ]]; then
  if command -v docker > /dev/null; then
    builder=docker
  elif command -v podman > /dev/null; then
    builder=podman
  else
    echo "neither docker nor podman is installed: install one (or set BUILDER)" >&2
    exit 1
  fi
fi
if [[ "${builder}" != docker && "${builder}" != podman ]]; then
  echo "BUILDER=${builder}: use docker or podman" >&2
  exit 2
fi
if ! command -v helm > /dev/null; then
  echo "helm is not installed: the chart is pushed with helm push (Helm 3.8 or later)" >&2
  exit 1
fi

cd "${REPO_ROOT}"
for image in "${IMAGES[@]}"; do
  read -r name context dockerfile <<< "${image}"
  ref="${registry}/${name}:${tag}"
  echo "+ ${ref} (${platforms})"
  if [[ "${builder}" == docker ]]; then
    docker buildx build --platform "${platforms}" -f "${dockerfile}" -t "${ref}" --push "${context}"
  else
    # A manifest list holds one image per platform; pushed whole with --all.
    podman manifest rm "${ref}" > /dev/null 2>&1 || true
    podman build --platform "${platforms}" -f "${dockerfile}" --manifest "${ref}" "${context}"
    podman manifest push --all "${ref}" "docker://${ref}"
  fi
done

# The chart, with appVersion (its default image tag) set to TAG.
package_dir="$(mktemp -d)"
trap 'rm -rf "${package_dir}"' EXIT
helm package charts/compass-operator --app-version "${tag}" --destination "${package_dir}"
helm push "${package_dir}/compass-operator-${version}.tgz" "oci://${registry}/charts"

cat << EOF
Pushed ${registry}/{compass-operator,compass-rag-sim,compass-qa-real}:${tag} and the chart. Install:
  helm install compass oci://${registry}/charts/compass-operator --version ${version} \\
    --namespace compass-system --create-namespace \\
    --set image.repository=${registry}/compass-operator
EOF
