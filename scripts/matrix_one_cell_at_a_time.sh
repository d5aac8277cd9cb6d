#!/usr/bin/env bash
# Run matrix cells one after another, removing each cell's virtualenv once its results are stored, so
# that a machine with room for one CUDA torch build at a time can run all of them.
#
#   scripts/matrix_one_cell_at_a_time.sh [--keep-going] CELL... [-- PYTEST_ARGS...]
#
# The runs share one label (GRACE_MATRIX_LABEL, default cells-<UTC time>) and go to the store named by
# GRACE_MATRIX_DB (default: the project's embedded SQLite store). A cell that fails is reported and the
# next one starts; the exit status is the number of failed cells (at most 125).
set -uo pipefail

cd "$(dirname "$0")/.."
cells=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    cells+=("$1")
    shift
done
[ "${1:-}" = "--" ] && shift
[ ${#cells[@]} -gt 0 ] || { echo "usage: $0 CELL... [-- PYTEST_ARGS...]" >&2; exit 2; }
export GRACE_MATRIX_LABEL="${GRACE_MATRIX_LABEL:-cells-$(date -u +%Y%m%dT%H%M%SZ)}"
nox_cmd=(python3 -m nox)

failed=0
for cell in "${cells[@]}"; do
    start=$(date +%s)
    echo "== cell $cell (label $GRACE_MATRIX_LABEL)"
    if "${nox_cmd[@]}" -s "cell($cell)" -- "$@"; then
        status=ok
    else
        status=failed
        failed=$((failed + 1))
    fi
    # nox names a session's venv after the session, with every character outside [A-Za-z0-9] as '-'.
    venv=".nox/cell-$(echo "$cell" | sed 's/[^A-Za-z0-9]/-/g')"
    rm -rf "$venv"
    echo "== cell $cell: $status in $(( $(date +%s) - start )) s; removed $venv"
done
exit $(( failed > 125 ? 125 : failed ))
