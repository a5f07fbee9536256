"""Print, for every checkpoint of a run, how far its attention heads are from uniform.

    python scripts/head_progress.py runs/sweep/h64-lr1e-3-seed1

Excess = (mass - chance) / (1 - chance) on same-row, same-column and self keys
(mclib.analyses.heads.head_scores): 0 for a uniform head, 1 for a pure one.
"""

import sys

from mclib.analyses.heads import attention_progress
from mclib.core.runs import run_profile

run = sys.argv[1]
profile = run_profile(run)
df = attention_progress(run, profile.data)
summary = df.groupby("step")[["row_excess", "column_excess", "self_excess"]].max()
print(f"{run}: largest excess over any head, per checkpoint")
print(summary.round(3).to_string())
