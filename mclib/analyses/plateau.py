"""The follow-up's plateau measures on matrix completion (Gopalani & Hu 2025, "What Happens
During the Loss Plateau?"; definitions and their limits on this task: docs/protocol.md §5.4).
Each is a function of (model, batch) -> a small table, with standard errors over matrices:

    representation_collapse   per hidden state: mean cosine similarity between the hidden
                              states of two masked entries of one matrix
    masked_spread             this task's analogue of repetition: the spread of the outputs
                              over a matrix's masked entries over that of the true values
                              (0: one value everywhere; 1: as spread as the truth)
    attention_share           per layer: the mass on the other keys of the query's row and
                              column (`heads.key_mass`), with its chance level 2(n-1)/n²

`plateau_table` reads every saved checkpoint of a run, skipping (with a line naming the step,
and in `attrs["skipped"]`) any that cannot be loaded.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import torch

from ..core.attention import position_masks
from ..core.checkpoints import load_checkpoint, saved_steps
from ..core.config import DataConfig
from ..core.metrics import drop_column, find_drop
from ..core.model import eval_mode
from ..core.runs import load_metrics, write_atomic
from ..core.sweep import finished, load_sweep
from .evaluate import sample_eval_batch
from .heads import capture_probs, key_mass

log = logging.getLogger(__name__)


def _masked_flat(batch) -> torch.Tensor:
    return batch.mask.reshape(batch.mask.shape[0], -1).bool()  # [batch, n²]


def representation_collapse(model, batch) -> pd.DataFrame:
    """One row per hidden state (layer 0: the embeddings' output; l: layer l's output):
    `cosine` (mean over matrices of the mean cosine similarity between the hidden states
    of two different masked entries), `se` (over matrices), `matrices` (those with at
    least two masked entries; the others have no pair)."""
    if not hasattr(model, "hidden_states"):
        raise ValueError(
            f"{type(model).__name__} has no hidden_states(tokens): representation_collapse reads a MatrixBert"
        )
    masked = _masked_flat(batch)
    with eval_mode(model):
        hidden = model.hidden_states(batch.tokens.to(next(model.parameters()).device))
    pair = (
        masked[:, :, None] & masked[:, None, :] & ~torch.eye(masked.shape[1], dtype=torch.bool)
    )  # [batch, q, k]
    pairs = pair.sum((1, 2))
    keep = pairs > 0
    if not keep.any():
        raise ValueError("no matrix of the batch has two masked entries: no pair to compare")
    rows = []
    for layer, h in enumerate(hidden):
        u = torch.nn.functional.normalize(h.detach().double().cpu(), dim=-1)  # [batch, seq, hidden]
        cos = u @ u.transpose(1, 2)  # [batch, seq, seq]
        per = (cos * pair).sum((1, 2))[keep] / pairs[keep]  # [matrices]
        rows.append(
            {
                "layer": layer,
                "cosine": per.mean().item(),
                "se": (per.std() / per.numel() ** 0.5).item() if per.numel() > 1 else float("nan"),
                "matrices": int(per.numel()),
            }
        )
    return pd.DataFrame(rows)


def _ratio_jackknife(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """sum(a) / sum(b) and its jackknife standard error (leave one matrix out)."""
    n = a.numel()
    ratio = (a.sum() / b.sum()).item()
    if n < 2:
        return ratio, float("nan")
    loo = (a.sum() - a) / (b.sum() - b)
    return ratio, ((n - 1) / n * ((loo - loo.mean()) ** 2).sum()).sqrt().item()


def masked_spread(model, batch) -> dict[str, float]:
    """`spread_ratio`: Σ over matrices of the std of the outputs at its masked entries,
    over Σ of the std of the true values there (matrices with at least two masked
    entries); `se` (jackknife over matrices), `matrices`."""
    masked = _masked_flat(batch)
    with eval_mode(model):
        pred = (
            model(batch.tokens.to(next(model.parameters()).device)).logits.detach().double().cpu()
        )  # [batch, n²]
    x = batch.x.reshape(masked.shape).double().cpu()
    count = masked.sum(1)
    keep = count >= 2
    if not keep.any():
        raise ValueError("no matrix of the batch has two masked entries: no spread to measure")

    def std(
        v: torch.Tensor,
    ) -> torch.Tensor:  # per matrix, over its masked entries (n - 1 in the denominator)
        v, m, c = v[keep], masked[keep].double(), count[keep].double()
        mean = (v * m).sum(1) / c
        return (((v - mean[:, None]) ** 2 * m).sum(1) / (c - 1)).sqrt()

    ratio, se = _ratio_jackknife(std(pred), std(x))
    return {"spread_ratio": ratio, "se": se, "matrices": int(keep.sum())}


def share_chance(n: int) -> float:
    """The attention share of a uniform head on n×n matrices, 2(n − 1)/n² (0.32 at 5×5)."""
    return 2 * (n - 1) / n**2


def attention_share(model, batch) -> pd.DataFrame:
    """One row per layer: `share` (mass on the other keys of the query's row and column,
    mean over heads, queries and matrices), `se` (over matrices), `chance` (2(n-1)/n²)."""
    n = batch.n
    keys = position_masks(n)
    row_col = keys["row"] | keys["column"]
    probs = capture_probs(model, batch)
    rows = []
    for layer in sorted(probs):
        per = key_mass(probs[layer].double(), row_col).mean(1)  # [batch]: mean over heads
        rows.append(
            {
                "layer": layer,
                "share": per.mean().item(),
                "se": (per.std() / per.numel() ** 0.5).item() if per.numel() > 1 else float("nan"),
                "chance": share_chance(n),
            }
        )
    return pd.DataFrame(rows)


def plateau_measures(model, batch) -> dict[str, float]:
    """The three measures of one model as one flat row: collapse_L{l} and collapse_se_L{l}
    per hidden state, spread_ratio and spread_se, share_L{l} and share_se_L{l} per layer,
    share_chance (the share of uniform attention)."""
    row = {}
    for r in representation_collapse(model, batch).itertuples():
        row[f"collapse_L{r.layer}"], row[f"collapse_se_L{r.layer}"] = r.cosine, r.se
    spread = masked_spread(model, batch)
    row["spread_ratio"], row["spread_se"] = spread["spread_ratio"], spread["se"]
    share = attention_share(model, batch)
    for r in share.itertuples():
        row[f"share_L{r.layer}"], row[f"share_se_L{r.layer}"] = r.share, r.se
    row["share_chance"] = float(share["chance"].iloc[0])
    return row


def plateau_table(
    run_dir: str | Path,
    data: DataConfig,
    n_matrices: int = 256,
    seed: int = 0,
    steps: list[int] | None = None,
) -> pd.DataFrame:
    """`plateau_measures` at every saved checkpoint of a run (or at `steps`), on one fixed
    batch (`sample_eval_batch(data, n_matrices, seed)`): one row per step. A checkpoint
    whose model cannot be read is skipped with a line on stderr naming its step; the
    skipped steps are in `attrs["skipped"]`."""

    run_dir = Path(run_dir)
    steps = saved_steps(run_dir) if steps is None else list(steps)
    batch = sample_eval_batch(data, n_matrices, seed)
    rows, skipped = [], []
    for step in steps:
        try:
            model = load_checkpoint(run_dir, step)
        except (FileNotFoundError, OSError, ValueError) as e:
            log.warning(
                f"plateau measures: {run_dir.name} step {step} skipped (no hidden states to read: "
                f"{str(e).splitlines()[0]})"
            )
            skipped.append(step)
            continue
        rows.append({"step": step, **plateau_measures(model, batch)})
    table = pd.DataFrame(rows)
    table.attrs["skipped"] = skipped
    return table


def measure_sweep(
    sweep_file: str | Path,
    results: str | Path,
    out: str | Path,
    runs: str | Path = "runs/sweep",
    *,
    n_matrices: int = 256,
    seed: int = 0,
) -> int:
    """`plateau_table` of every run of a sweep with a row in `results` and none yet in `out`;
    its rows, with setting, seed, bias and drop step, are added to the CSV `out` (rewritten
    atomically). Returns how many runs it measured."""

    out = Path(out)
    todo = load_sweep(sweep_file, runs)
    have = finished(Path(results), todo)
    old = pd.read_csv(out) if out.is_file() else pd.DataFrame(columns=["setting", "seed"])
    measured = set(zip(old["setting"].astype(str), old["seed"].astype(int)))
    frames = []
    for run in todo:
        if (run.sweep, run.setting, run.seed) not in have or (run.setting, run.seed) in measured:
            continue
        p = run.profile
        drop = find_drop(load_metrics(run.run_dir), rank=p.data.rank, column=drop_column(p))
        t = plateau_table(run.run_dir, p.data, n_matrices=n_matrices, seed=seed)
        frames.append(
            t.assign(
                setting=run.setting,
                seed=run.seed,
                attn_bias=p.model.attn_bias,
                attn_bias_target=p.model.attn_bias_target,
                drop_step=drop,
            )
        )
    if frames:
        table = (
            pd.concat([old, *frames], ignore_index=True) if len(old) else pd.concat(frames, ignore_index=True)
        )
        lead = ["setting", "seed", "attn_bias", "attn_bias_target", "drop_step", "step"]
        table = table[lead + [c for c in table.columns if c not in lead]]
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, lambda tmp: table.to_csv(tmp, index=False))
    return len(frames)
