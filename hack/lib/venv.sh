# shellcheck shell=bash
# Shared bootstrap for hack/*.sh: make sure .venv exists at the repo root and holds the
# project installed in editable mode with the requested extras. Source it, then call
#   ensure_venv            # runtime dependencies only
#   ensure_venv dev        # with the [dev] extra and the development tools (dev/compass_dev)
#   ensure_venv demo       # the development tools alone, which run `compass demo` (and [local])
# Re-installs when pyproject.toml (or dev/pyproject.toml) is newer than the stamp, so a
# dependency change is picked up without anyone remembering to delete .venv.

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${REPO_ROOT}/.venv"
PYTHON="${PYTHON:-python3}"

ensure_venv() {
    local extras="${1:-}"
    local spec="."
    local stamp="${VENV}/.compass-installed"
    [[ -n "${extras}" ]] && stamp="${VENV}/.compass-installed-${extras}"
    # demo is no extra of the package: the development tools' own requirements ([local]) serve it.
    [[ -n "${extras}" && "${extras}" != "demo" ]] && spec=".[${extras}]"
    # The development tools are a distribution of their own (dev/pyproject.toml), so that the
    # operator's package and image never carry them; installed in the same pip run, which
    # resolves their compass-operator requirement to this checkout.
    local -a editables=(-e "${spec}")
    [[ "${extras}" == "dev" || "${extras}" == "demo" ]] && editables+=(-e ./dev)

    if [[ ! -x "${VENV}/bin/python" ]]; then
        echo "hack: creating ${VENV} with $(${PYTHON} --version 2>&1)" >&2
        "${PYTHON}" -m venv "${VENV}"
    fi
    if [[ ! -f "${stamp}" || "${REPO_ROOT}/pyproject.toml" -nt "${stamp}" \
        || "${REPO_ROOT}/dev/pyproject.toml" -nt "${stamp}" ]]; then
        echo "hack: installing ${editables[*]} into .venv (quiet)" >&2
        # -qq: show errors only (pip warnings such as unreachable extra indexes are noise here).
        # Old pips in a fresh venv cannot do editable installs from pyproject.toml alone.
        "${VENV}/bin/python" -m pip install --quiet --quiet --upgrade pip
        (cd "${REPO_ROOT}" && "${VENV}/bin/python" -m pip install --quiet --quiet "${editables[@]}")
        touch "${stamp}"
    fi
}
