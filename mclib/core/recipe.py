"""What a deviation from the paper's recipe can be: the keys of a profile that change what a run
computes (`RECIPE`), the train keys that only say how a run is executed (`RUNNING`), and
`deviations`, every recipe key where a profile differs from another (normally the paper's).
It imports nothing of mclib: `deviations` takes any two `mclib.core.config.Profile`s untyped.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

# What a deviation from the paper's recipe can be: the task and how the model is built and
# trained. Not bookkeeping (logging, checkpoint steps, threads, device) nor analysis sizes.
RECIPE = ("data", "model", "train")
# Precision is recipe: TF32 and bf16 round the model's products, so they are departures.
# The train keys that say how a run is executed (where, how fast, until when it keeps going, how
# often Adam's state is kept): not recipe, and free to change when a run folder is resumed
# (mclib.core.runs.check_same_profile reads this list; it also lets train.steps grow, which is
# recipe: a run may be resumed to train longer).
RUNNING = ("device", "threads", "compile", "step", "until", "patience", "min_improvement", "state_every")
# Not recipe either, but fixed for a run folder, so not in RUNNING: what the folder records
# (eval_every, eval_batch, log_every: its metric rows; save_every: its checkpoints), the
# attention implementation (sdpa or eager) and Adam's kernels (foreach or fused): the same model
# and optimiser, other rounding.
_NOT_RECIPE = {
    "train": RUNNING + ("eval_every", "eval_batch", "save_every", "log_every", "adam"),
    "model": ("attention",),
}


def deviations(profile: Any, reference: Any) -> list[dict[str, Any]]:
    """Every recipe key (task, model, optimisation) where `profile` differs from `reference`
    (normally the paper's profile): [{"key": "data.n", "profile": 5, "paper": 7}, ...]."""
    out = []
    for section in RECIPE:
        ours, theirs = getattr(profile, section), getattr(reference, section)
        for f in fields(ours):
            if f.name in _NOT_RECIPE.get(section, ()):
                continue
            a, b = getattr(ours, f.name), getattr(theirs, f.name)
            if a != b:
                out.append({"key": f"{section}.{f.name}", "profile": a, "paper": b})
    return out
