#!/usr/bin/env bash
# One GPU lease of this project, as two commands issued back to back (docs/gpu.md):
#
#   LEFT_S=<device s left> bash scripts/lease.sh start    # the kit, the step measured, the next slice started
#   LEFT_S=<device s left> bash scripts/lease.sh finish   # its training awaited, its chapters executed,
#                                                         # $OUT/results.tgz packed
#
# LEFT_S is the device time left as the command begins (the device tool's status, budget_left_s);
# without it, a 900 s lease less a 3-minute start (720) for `start`, and `start`'s own budget for
# `finish`. Neither command runs past the device's 600 s limit (COMMAND_S): each ends 20 s before
# it, counted from when the command began.
#
# `start` installs the kit from $KIT (default ./.kit) if papermill, ipykernel or myst_nb is
# missing (the wheels of `python scripts/wheelhouse.py --kit --out .kit`, carried with the
# command; mclib itself runs from the checkout), measures the step (benchmarks/lease_step.py:
# each variant checked against eager and timed, or, where the committed table results/lease_step.csv
# measured this very step, eager and the variant it chose; the table in $OUT/lease_step.csv, its
# top kernels and any variant's traceback beside it, copies in $WORK, from which the slice picks
# its variant), within what the lease leaves (BENCH_S at most) and under a hard `timeout`; a
# variant cut at its cap or one that leaves the device unusable ends that process, and the
# variants after it are measured once more in a fresh one. Then `python -m mclib slice start`:
# the ledger's next slice (results/paper-slices.yaml) is refused in one line if it cannot fit the
# time left, else it trains in a process of its own, which outlives this command, under the
# slice's deadline, and this command holds HOLD_S seconds while it runs. Without the kit the step
# is measured all the same and the slice is refused in one line. Its output is kept in
# $WORK/lease-start.log. `finish`, issued at once (the machine is handed back 30 s after a
# command ends), waits for that training until its deadline + 60 s, then asks it to stop
# (SIGTERM: it saves and ends "cut") and 30 s later kills it, executes the slice's chapters while
# time is left, and packs everything that comes back into one file, $OUT/results.tgz, with the
# logs' tails and the step table; with no slice started, a results.tgz that says why. Back here:
# python -m mclib slice merge results.tgz. A chapter that failed (its cause fixed here, the fix
# travels with the next call): `bash scripts/lease.sh finish --chapters-s 200` on the still-warm
# machine executes the chapters not yet done and packs again.
#
# Settings (environment): OUT (default kit-out), WORK (default slice-work: runs, executed
# chapters, logs), PYTHON (default python3), LEFT_S (above), KIT (default .kit), BENCH_S
# (default 110: the measurement's most), HOLD_S (default 420), LEDGER (default
# results/paper-slices.yaml; tests/test_slices.py and tests/test_lease_faults.py rehearse this
# script with a smoke ledger), BENCH_ARGS (more arguments for the measurement); the device's limits,
# which a rehearsal on a scaled clock scales: COMMAND_S (600), RETURN_S (20), SPARE_S (20),
# PACK_S (40), MIN_BENCH_S (15).
set -uo pipefail
cd "$(dirname "$0")/.."
began=$(date +%s)
py="${PYTHON:-python3}"
out="${OUT:-kit-out}"
work="${WORK:-slice-work}"
kit="${KIT:-.kit}"
command_s="${COMMAND_S:-600}"
return_s="${RETURN_S:-20}"      # the results' way back (mclib.lease.slices.RETURN_S)
spare_s="${SPARE_S:-20}"        # a command ends this long before its limit (slices.COMMAND_SPARE_S)
pack_s="${PACK_S:-40}"          # a slice's packing (slices.COLLECT_S) and 10 s, kept from the measurement
min_bench_s="${MIN_BENCH_S:-15}"  # less than this left for it, the step is not measured
ledger=(); [ -n "${LEDGER:-}" ] && ledger=(--ledger "$LEDGER")
# MCLIB_KIT: the kit records the revision of the tree it was built from (mclib.core.repo.git_revision
# reads it: this copy of the tree has no .git of its own)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MCLIB_KIT="$kit"
mkdir -p "$out" "$work"
elapsed() { echo $(( $(date +%s) - began )); }
case "${1:-}" in
start)
    rm -f "$work/slice-refused.txt" "$work/lease_step.csv" "$work/lease_step_errors.log"
    exec > >(tee "$work/lease-start.log") 2> >(tee -a "$work/lease-start.log" >&2)
    left_s="${LEFT_S:-720}"
    nokit=""
    if ! "$py" -c "import papermill, ipykernel, myst_nb" 2>/dev/null; then
        if [ ! -d "$kit" ]; then
            nokit="no $kit and papermill, ipykernel or myst_nb is not installed (python scripts/wheelhouse.py --kit --out .kit, then carry .kit)"
        else
            "$py" -m pip install -q --no-index --no-deps --no-compile "$kit"/*.whl \
                || nokit="the kit in $kit did not install (pip exit $?)"
        fi
    fi
    echo "lease: kit ${nokit:+not }ready after $(elapsed) s; $left_s s of device time left as the command began"
    # the measurement gets what the lease and the command leave, less a slice's packing and 10 s
    bench=$(( ${BENCH_S:-110} ))
    fit=$(( left_s - return_s - $(elapsed) - pack_s )); [ "$fit" -lt "$bench" ] && bench=$fit
    fit=$(( command_s - spare_s - $(elapsed) - pack_s )); [ "$fit" -lt "$bench" ] && bench=$fit
    if [ "$bench" -lt "$min_bench_s" ]; then
        echo "lease: the step not measured: $bench s would be left for it (at least $min_bench_s needed)" >&2
    else
        [ "$bench" -lt "${BENCH_S:-110}" ] && echo "lease: the step's measurement cut to $bench s (what the lease leaves)"
        b0=$(date +%s)
        # the hard stop, past the measurement's own caps (eager's and each variant's: the budget + 10 s, at least 30)
        timeout -k 5 $(( (bench > 30 ? bench : 30) + 40 )) "$py" benchmarks/lease_step.py --budget-s "$bench" --out "$out/lease_step.csv" \
            "${ledger[@]}" ${BENCH_ARGS:-}
        code=$?
        again=$(( bench - ($(date +%s) - b0) ))   # what is left of the measurement's time
        if [ "$code" -eq 3 ] && [ -f "$out/lease_step.csv" ] && [ "$again" -ge "$min_bench_s" ]; then
            echo "lease: the measurement stopped at a variant (its row says why); the variants after it, once more"
            timeout -k 5 $(( (again > 30 ? again : 30) + 40 )) "$py" benchmarks/lease_step.py --budget-s "$again" --resume \
                --out "$out/lease_step.csv" "${ledger[@]}" ${BENCH_ARGS:-}
            code=$?
        fi
        [ "$code" -eq 0 ] || echo "lease: the step's measurement ended with exit $code (its table says what ran)" >&2
    fi
    # the slice trains with the fastest variant that passed its check in this table (mclib.lease.slices.pick_step)
    for f in lease_step.csv lease_step_errors.log; do [ -f "$out/$f" ] && cp "$out/$f" "$work/"; done
    if [ -n "$nokit" ]; then
        echo "no slice started: $nokit" > "$work/slice-refused.txt"
        echo "lease: no slice started: $nokit" >&2
        exit 3
    fi
    left=$(( left_s - return_s - $(elapsed) ))
    "$py" -m mclib slice start --out "$work" --budget-s "$left" --hold-s "${HOLD_S:-420}" --began "$began" \
        --command-s "$command_s" "${ledger[@]}"
    ;;
finish)
    exec "$py" -m mclib slice finish --out "$work" --dest "$out" --began "$began" --command-s "$command_s" \
        ${LEFT_S:+--left-s "$LEFT_S"} "${ledger[@]}" "${@:2}"
    ;;
*)
    echo "usage: [LEFT_S=S] bash scripts/lease.sh start|finish (docs/gpu.md)" >&2
    exit 2
    ;;
esac
