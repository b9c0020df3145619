#!/usr/bin/env bash
# Build a real Kubernetes control plane (kube-apiserver, kube-controller-manager, kubectl) from
# Debian's `kubernetes` SOURCE package, and cache the binaries; also install etcd and openssl.
#
#   hack/k8s/build.sh            prints the binaries' directory on stdout (logs go to stderr)
#
# Idempotent: a second run finds the cache and returns in well under a second. Everything comes
# through apt (Debian packages, and the source package via `apt-get source` with a PRIVATE apt
# configuration, so the system's sources.list is never touched); Go builds in GOPATH mode from
# the package's vendor/ with GOPROXY=off, so nothing is fetched from the Go module proxy.
#
# Environment:
#   COMPASS_K8S_CACHE      cache root (default ~/.cache/compass-k8s); binaries in <root>/<version>/bin
#   COMPASS_K8S_KEEP_WORK  1: keep the source tree and Go build cache after a successful build
#
# Exit status: 0 built or cached; 3 cannot build on this machine (not root, no apt-get: the
# reason is the last line on stderr, and the k8s test tier skips with it); anything else: the
# build failed (the log tail is printed, the whole log kept under the cache root).
set -Eeuo pipefail

K8S_VERSION="1.20.2"            # upstream version inside Debian 12's "1.20.5+really1.20.2"
SOURCE_PACKAGE="kubernetes"
BINARIES=(kube-apiserver kube-controller-manager kubectl)
# Runtime: etcd and openssl (certificates). Build: Go 1.19, reflect2 1.0.2 (the vendored 1.0.1
# crashes the API server on the first custom resource under Go 1.19), dpkg-source, make & co.
RUNTIME_PACKAGES=(etcd-server openssl)
BUILD_PACKAGES=(golang-go golang-github-modern-go-reflect2-dev dpkg-dev make rsync jq xz-utils
    ca-certificates)
DEBIAN_MIRROR="${COMPASS_K8S_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DEBIAN_SECURITY="${COMPASS_K8S_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}"
KEYRING="/usr/share/keyrings/debian-archive-keyring.gpg"

CACHE_ROOT="${COMPASS_K8S_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/compass-k8s}"
VERSION_DIR="${CACHE_ROOT}/${K8S_VERSION}"
BIN_DIR="${VERSION_DIR}/bin"
STAMP="${BIN_DIR}/.complete"

T0=$(date +%s.%N)
say() { echo "hack/k8s/build.sh: $*" >&2; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f s", b - a }'; }
cannot() { say "cannot build the Kubernetes control plane here: $*"; exit 3; }

binaries_cached() {
    [[ -f "${STAMP}" ]] || return 1
    local b
    for b in "${BINARIES[@]}"; do [[ -x "${BIN_DIR}/${b}" ]] || return 1; done
}

# Packages not installed yet (dpkg status "install ok installed").
missing_packages() {
    local p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "${p}" 2>/dev/null | grep -q "install ok installed" ||
            echo "${p}"
    done
}

APT_UPDATED=0
apt_install() {
    local missing
    mapfile -t missing < <(missing_packages "$@")
    [[ ${#missing[@]} -eq 0 ]] && return 0
    command -v apt-get >/dev/null 2>&1 || cannot "no apt-get to install ${missing[*]}"
    [[ $(id -u) -eq 0 ]] || cannot "not root; install them with: sudo apt-get install ${missing[*]}"
    local t out
    t=$(date +%s.%N)
    out=$(mktemp)
    export DEBIAN_FRONTEND=noninteractive
    say "installing ${missing[*]} from Debian"
    # apt-get update once per run, and only when something is missing.
    if [[ ${APT_UPDATED} -eq 0 ]]; then
        apt-get update -qq >"${out}" 2>&1 || { cat "${out}" >&2; cannot "apt-get update failed"; }
        APT_UPDATED=1
    fi
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >"${out}" 2>&1 ||
        { tail -n 20 "${out}" >&2; cannot "apt-get install ${missing[*]} failed"; }
    rm -f "${out}"
    say "installed ${missing[*]} ($(elapsed "${t}"))"
}

mkdir -p "${CACHE_ROOT}"
# One build at a time (several pytest sessions or shells may ask at once).
exec 9>"${CACHE_ROOT}/.lock"
flock 9

if binaries_cached; then
    # A cache restored onto a new machine still needs etcd and openssl there.
    if ! command -v etcd >/dev/null 2>&1 || ! command -v openssl >/dev/null 2>&1; then
        command -v dpkg-query >/dev/null 2>&1 || cannot "no etcd or openssl on PATH"
        apt_install "${RUNTIME_PACKAGES[@]}"
    fi
    say "cached in ${BIN_DIR} ($(elapsed "${T0}"))"
    echo "${BIN_DIR}"
    exit 0
fi

say "no cached binaries in ${BIN_DIR}: building Kubernetes ${K8S_VERSION} from Debian's source package"
[[ "$(uname -m)" == "x86_64" || "$(uname -m)" == "aarch64" ]] || cannot "unsupported machine $(uname -m)"
command -v dpkg-query >/dev/null 2>&1 || cannot "not a Debian system (no dpkg-query)"
apt_install "${RUNTIME_PACKAGES[@]}" "${BUILD_PACKAGES[@]}"
[[ -r "${KEYRING}" ]] || cannot "no Debian archive keyring at ${KEYRING}"

WORK="${VERSION_DIR}/work"
LOG="${VERSION_DIR}/build.log"
rm -rf "${WORK}"
mkdir -p "${WORK}" "${VERSION_DIR}"
: >"${LOG}"
on_error() {
    local rc=$?
    say "FAILED (exit ${rc}) after $(elapsed "${T0}"); last lines of ${LOG}:"
    tail -n 40 "${LOG}" >&2 || true
    exit "${rc}"
}
trap on_error ERR

# --- 1. the source package, through a private apt configuration (deb-src lines only)
t=$(date +%s.%N)
# shellcheck disable=SC1091
CODENAME="$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")"
APT_DIR="${WORK}/apt"
mkdir -p "${APT_DIR}/lists/partial" "${APT_DIR}/cache/archives/partial"
cat >"${APT_DIR}/sources.list" <<EOF
deb-src [signed-by=${KEYRING}] ${DEBIAN_MIRROR} ${CODENAME} main
deb-src [signed-by=${KEYRING}] ${DEBIAN_MIRROR} ${CODENAME}-updates main
deb-src [signed-by=${KEYRING}] ${DEBIAN_SECURITY} ${CODENAME}-security main
EOF
APT_OPTS=(
    -o "Dir::Etc::sourcelist=${APT_DIR}/sources.list"
    -o "Dir::Etc::sourceparts=/nonexistent"
    -o "Dir::State::lists=${APT_DIR}/lists"
    -o "Dir::Cache=${APT_DIR}/cache"
    -o "APT::Sandbox::User=$(id -un)"
)
apt-get "${APT_OPTS[@]}" update >>"${LOG}" 2>&1
mkdir -p "${WORK}/fetch"
(cd "${WORK}/fetch" && apt-get "${APT_OPTS[@]}" source --only-source "${SOURCE_PACKAGE}") >>"${LOG}" 2>&1
SRC_FETCHED=$(find "${WORK}/fetch" -mindepth 1 -maxdepth 1 -type d -name "${SOURCE_PACKAGE}-*" | head -n 1)
[[ -n "${SRC_FETCHED}" ]] || { echo "apt-get source unpacked nothing" >>"${LOG}"; false; }
if [[ "${SRC_FETCHED}" != *"${K8S_VERSION}" ]]; then
    echo "expected upstream ${K8S_VERSION}, apt gave $(basename "${SRC_FETCHED}")" >>"${LOG}"
    false
fi
# GOPATH layout, as Debian's own debian/rules does it.
export GOPATH="${WORK}/go"
SRC="${GOPATH}/src/k8s.io/kubernetes"
mkdir -p "$(dirname "${SRC}")"
mv "${SRC_FETCHED}" "${SRC}"
rm -rf "${WORK}/fetch" "${APT_DIR}"
say "fetched $(basename "${SRC_FETCHED}") with apt-get source ($(elapsed "${t}"))"

# --- 2. patch the tree: Debian's reflect2 1.0.2 instead of the vendored 1.0.1
rm -rf "${SRC}/vendor/github.com/modern-go/reflect2"
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "${SRC}/vendor/github.com/modern-go/"
# No .git in a source package: give the build its version so /version and kubectl say 1.20.2.
cat >"${WORK}/version.env" <<EOF
KUBE_GIT_COMMIT='debian-$(basename "${SRC_FETCHED}")'
KUBE_GIT_TREE_STATE='clean'
KUBE_GIT_VERSION='v${K8S_VERSION}'
KUBE_GIT_MAJOR='${K8S_VERSION%%.*}'
KUBE_GIT_MINOR='$(echo "${K8S_VERSION}" | cut -d. -f2)'
EOF

# --- 3. build in GOPATH mode from vendor/, nothing from the network
export GO111MODULE=off GOPROXY=off GOFLAGS="" GOSUMDB=off CGO_ENABLED=0
export GOCACHE="${WORK}/gocache" KUBE_GIT_VERSION_FILE="${WORK}/version.env"
export PATH="/usr/lib/go/bin:${PATH}"
say "$(go version); building (nice'd; log in ${LOG})"
t=$(date +%s.%N)
(cd "${SRC}" && nice -n 10 make gen_openapi) >>"${LOG}" 2>&1
say "make gen_openapi ($(elapsed "${t}"))"
t=$(date +%s.%N)
targets=()
for b in "${BINARIES[@]}"; do targets+=("cmd/${b}"); done
(cd "${SRC}" && nice -n 10 hack/make-rules/build.sh "${targets[@]}") >>"${LOG}" 2>&1
say "go build ${BINARIES[*]} ($(elapsed "${t}"))"

# --- 4. cache: copy, then swap in atomically
rm -rf "${BIN_DIR}.new"
mkdir -p "${BIN_DIR}.new"
for b in "${BINARIES[@]}"; do cp "${SRC}/_output/bin/${b}" "${BIN_DIR}.new/${b}"; done
"${BIN_DIR}.new/kube-apiserver" --version >>"${LOG}" 2>&1
cp "${WORK}/version.env" "${BIN_DIR}.new/.complete"
rm -rf "${BIN_DIR}"
mv "${BIN_DIR}.new" "${BIN_DIR}"
trap - ERR
if [[ "${COMPASS_K8S_KEEP_WORK:-0}" != "1" ]]; then
    # Go's GOPATH mode writes read-only module files; make them removable first.
    chmod -R u+w "${WORK}" 2>/dev/null || true
    rm -rf "${WORK}"
fi
say "built ${BINARIES[*]} into ${BIN_DIR} (total $(elapsed "${T0}"))"
echo "${BIN_DIR}"
