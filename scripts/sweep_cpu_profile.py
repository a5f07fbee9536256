"""The default-profile search, on the sweep command (`python -m mclib sweep`,
mclib/core/sweep.py): run a list of settings, each under a wall-time cap, and append one row
per run to the search's results table.

    python scripts/sweep_cpu_profile.py sweeps/round1.yaml [--jobs 2] [--results docs/data/cpu_sweep.csv]
                                        [--cluster tcp://HOST:8786]

is `python -m mclib sweep FILE --results docs/data/cpu_sweep.csv --runs runs/sweep
--threads CORES/JOBS`: --jobs 2 trains two runs at once on this machine, one thread each
(ms per step in the table is then the one-thread figure; docs/cpu-profile.md gives the
clean two-thread timings). The sweep file's format, caps, `after_drop` and `resume`: see
mclib/core/sweep.py. `--collect` trains nothing: it adds rows for runs of the sweep that were
stopped by hand before finishing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mclib.__main__ import main as mclib_main
from mclib.core.jobs import cores
from mclib.core.runs import METRICS
from mclib.core.sweep import append_row, finished, load_sweep
from mclib.core.sweep_run import summarise


def collect(sweep: str, results: Path, runs: str) -> None:
    todo = load_sweep(sweep, runs)
    have = finished(results, todo)
    for run in todo:
        if (run.sweep, run.setting, run.seed) not in have and (run.run_dir / METRICS).exists():
            append_row(results, {**summarise(run), "note": "stopped by hand before its cap"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep")
    ap.add_argument(
        "--jobs", type=int, default=1, help="runs at once on this machine (threads a run: cores / jobs)"
    )
    ap.add_argument("--results", default="docs/data/cpu_sweep.csv")
    ap.add_argument("--run-root", default="runs/sweep")
    ap.add_argument("--cluster", help="a Dask scheduler or jobqueue YAML (python -m mclib sweep --help)")
    ap.add_argument(
        "--collect",
        action="store_true",
        help="do not train: add rows for runs of this sweep that were stopped before finishing",
    )
    args = ap.parse_args()
    if args.collect:
        collect(args.sweep, Path(args.results), args.run_root)
        return 0
    figure = Path(args.run_root) / f"{Path(args.sweep).stem}.png"
    argv = [
        "sweep",
        args.sweep,
        "--results",
        args.results,
        "--runs",
        args.run_root,
        "--figure",
        str(figure),
        "--threads",
        str(max(1, cores() // args.jobs)),
    ]
    return mclib_main(argv + (["--cluster", args.cluster] if args.cluster else []))


if __name__ == "__main__":
    sys.exit(main())
