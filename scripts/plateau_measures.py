"""The follow-up's plateau measures (mclib.analyses.plateau) at every saved
checkpoint of the finished runs of a sweep, added to a table:

    python scripts/plateau_measures.py sweeps/attention-bias.yaml --results docs/data/attention_bias.csv \
        --out docs/data/attention_bias_measures.csv [--runs runs/sweep] [--matrices 256] [--seed 0]

A run is measured once it has its row in --results (the sweep wrote it when the run ended)
and not yet in --out, so the command can be run again as the sweep goes on. It reads the
run folders under --runs: on another machine than the one that trained them, nothing is
measured.
"""

from __future__ import annotations

import argparse
import sys

from mclib.analyses.plateau import measure_sweep


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep")
    ap.add_argument("--results", required=True, help="the sweep's results table (CSV)")
    ap.add_argument("--out", required=True, help="the measures table (CSV), rows added")
    ap.add_argument("--runs", default="runs/sweep")
    ap.add_argument("--matrices", type=int, default=256, help="matrices in the fixed batch (default 256)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fixed batch (default 0)")
    a = ap.parse_args()
    added = measure_sweep(a.sweep, a.results, a.out, a.runs, n_matrices=a.matrices, seed=a.seed)
    print(f"plateau measures: {added} run{'s' if added != 1 else ''} added to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
