#!/usr/bin/env bash
# One GPU lease of this project, as two commands issued back to back (docs/gpu.md):
#
#   bash scripts/lease.sh start    # the kit (<= 15 s), the step measured (<= 110 s), the next slice started
#   bash scripts/lease.sh finish   # its training awaited, its chapters executed, $OUT/results.tgz packed
#
# `start` installs the kit from ./.kit if papermill, ipykernel or myst_nb is missing (the
# wheels of `python scripts/wheelhouse.py --kit --out .kit`, carried with the command; mclib
# itself runs from the checkout), measures the step (benchmarks/lease_step.py: each variant checked
# against eager and timed; its table in $OUT/lease_step.csv, its top kernels beside it, and a copy in
# $WORK, from which the slice picks its variant), then `python -m mclib slice start`: the ledger's next slice
# (results/paper-slices.yaml) is refused in one line if it cannot fit the lease's time left,
# else it trains in a process of its own, which outlives this command, under the slice's
# deadline, and this command holds HOLD_S seconds while it runs. `finish`, issued at once
# (the machine is handed back 30 s after a command ends), waits for that training, executes
# the slice's chapters while time is left, and packs everything that comes back into one
# file, $OUT/results.tgz. Back here: python -m mclib slice merge results.tgz. A chapter that failed
# (its cause fixed here, the fix travels with the next call): `bash scripts/lease.sh finish
# --chapters-s 200` on the still-warm machine executes the chapters not yet done and packs again.
#
# Settings (environment): OUT (default kit-out), WORK (default slice-work: runs, executed
# chapters), PYTHON (default python3), BUDGET_S (default 760: the lease's 900 s less the
# machine's start and the return), BENCH_S (default 110), HOLD_S (default 420), LEDGER (default
# results/paper-slices.yaml; tests/test_slices.py rehearses this script with a smoke ledger).
set -uo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
out="${OUT:-kit-out}"
work="${WORK:-slice-work}"
ledger=(); [ -n "${LEDGER:-}" ] && ledger=(--ledger "$LEDGER")
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$out"
case "${1:-}" in
start)
    t0=$(date +%s)
    if ! "$py" -c "import papermill, ipykernel, myst_nb" 2>/dev/null; then
        [ -d .kit ] || { echo "lease: no ./.kit: run python scripts/wheelhouse.py --kit --out .kit and carry .kit" >&2; exit 3; }
        "$py" -m pip install -q --no-index --no-deps --no-compile .kit/*.whl || { echo "lease: kit install failed" >&2; exit 3; }
    fi
    echo "lease: kit ready after $(( $(date +%s) - t0 )) s"
    "$py" benchmarks/lease_step.py --budget-s "${BENCH_S:-110}" --out "$out/lease_step.csv" "${ledger[@]}" ${BENCH_ARGS:-} \
        || echo "lease: the step benchmark failed (exit $?); the slice starts all the same, eagerly" >&2
    # the slice trains with the fastest variant that passed its check in this table (mclib.lease.slices.pick_step)
    mkdir -p "$work" && { [ -f "$out/lease_step.csv" ] && cp "$out/lease_step.csv" "$work/" || rm -f "$work/lease_step.csv"; }
    left=$(( ${BUDGET_S:-760} - ($(date +%s) - t0) ))
    exec "$py" -m mclib slice start --out-dir "$work" --budget-s "$left" --hold-s "${HOLD_S:-420}" "${ledger[@]}"
    ;;
finish)
    exec "$py" -m mclib slice finish --out-dir "$work" --dest "$out" "${ledger[@]}" "${@:2}"
    ;;
*)
    echo "usage: bash scripts/lease.sh start|finish (docs/gpu.md)" >&2
    exit 2
    ;;
esac
