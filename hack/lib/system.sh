# shellcheck shell=bash
# System packages the test tiers need, from Debian: prometheus (the triton tier's metrics) and
# its promtool (the unit tier checks the chart's alert rules with it).
# Source it, then call ensure_system_packages. Installs only what is missing, only as root;
# otherwise it says what to install and the tests that need it skip loudly (or fail, under
# COMPASS_REQUIRE_TIERS=1 as in CI: tests/tiers.py).

ensure_system_packages() {
    local missing=()
    # promtool (the chart's alert rules are checked with it in the unit tier) ships with it.
    if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
        missing+=(prometheus)
    fi
    [[ ${#missing[@]} -eq 0 ]] && return 0
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        echo "hack: missing ${missing[*]}; install with: sudo apt-get install ${missing[*]}" >&2
        return 0
    fi
    echo "hack: installing ${missing[*]} from Debian (quiet)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
