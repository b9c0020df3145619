# shellcheck shell=bash
# Shared bootstrap for hack/*.sh: make sure .venv exists at the repo root and holds the
# project installed in editable mode with the requested extras. Source it, then call
#   ensure_venv            # runtime dependencies only
#   ensure_venv dev        # with the [dev] extra
# Re-installs when pyproject.toml is newer than the stamp, so a dependency change is
# picked up without anyone remembering to delete .venv.

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${REPO_ROOT}/.venv"
PYTHON="${PYTHON:-python3}"

ensure_venv() {
    local extras="${1:-}"
    local spec="."
    local stamp="${VENV}/.compass-installed"
    [[ -n "${extras}" ]] && spec=".[${extras}]" && stamp="${VENV}/.compass-installed-${extras}"

    if [[ ! -x "${VENV}/bin/python" ]]; then
        echo "hack: creating ${VENV} with $(${PYTHON} --version 2>&1)" >&2
        "${PYTHON}" -m venv "${VENV}"
    fi
    if [[ ! -f "${stamp}" || "${REPO_ROOT}/pyproject.toml" -nt "${stamp}" ]]; then
        echo "hack: installing -e '${spec}' into .venv (quiet)" >&2
        # -qq: show errors only (pip warnings such as unreachable extra indexes are noise here).
        # Old pips in a fresh venv cannot do editable installs from pyproject.toml alone.
        "${VENV}/bin/python" -m pip install --quiet --quiet --upgrade pip
        (cd "${REPO_ROOT}" && "${VENV}/bin/python" -m pip install --quiet --quiet -e "${spec}")
        touch "${stamp}"
    fi
}
