"""Chapter 08_gpt (book/08_gpt.ipynb): E19, the paper's GPT variant, a 2-layer, 2-head decoder
(`mclib.core.gpt`) that reads the masked matrix, a separator and the full matrix with teacher
forcing. The paper reports a plateau, then a sudden drop that is the model learning to copy the
observed entries, not to complete the masked ones (paper Figs. 11-12, NeurIPS version).

    runs = gpt_runs(ch); curves = gpt_curves(runs)   # {seed: folder}, {seed: metrics}
    loss_figure(ch, curves); shapes_shown(ch, curves); attention_figure(ch, runs, curves)
    glue, rows = readings(ch, curves); scorecard_table(ch, rows)

The drop is read in L (`DROP_COLUMN`), as the paper does: copying takes L from E[X²] to
p_mask·E[X²], below find_drop's half-way line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..analyses.evaluate import sample_eval_batch
from ..analyses.sharpness import ABRUPT, shape, shapes_table
from ..book.chapter import Chapter
from ..book.plots_base import closed
from ..book.plots_curves import gpt_loss_curves
from ..book.scorecard import claim, recorded_table
from ..book.scorecard_rules import CUT, agreement
from ..book.spec import ChapterSpec
from ..core.checkpoints import load_checkpoint, saved_steps
from ..core.config import Profile, load_profile, profile_path
from ..core.data import copy_level
from ..core.ending import is_complete
from ..core.jobs import run_profile_jobs
from ..core.metrics import COPIES, DROP_FRACTION, last_tenth
from ..core.precision import with_device
from ..core.runs import load_metrics, run_name
from ..core.train import train_seed
from .heads_plots import attention_grid

CHAPTER = "08_gpt"
COMPLETES = DROP_FRACTION  # masked entries completed: final L_mask below find_drop's half-way line


def gpt_profile(cfg: Profile) -> Profile:
    """params/gpt.yaml on the book's task, device and seeds, named gpt-BOOKPROFILE;
    `analysis.gpt_steps` shortens it."""
    gpt = load_profile(profile_path("gpt"))
    over = {
        "name": f"gpt-{cfg.name}",
        "seed": cfg.seed,
        "data": cfg.to_dict()["data"],
        "train.device": cfg.train.device,
        "analysis.seeds": cfg.analysis.seeds,
    }
    steps = cfg.analysis.gpt_steps
    if steps is not None:
        every = max(1, steps // 6)
        over.update(
            {
                "train.steps": steps,
                "train.save_every": every,
                "train.eval_every": every,
                "train.log_every": every,
                "checkpoints.pre": every,
                "checkpoints.transition": [],
                "checkpoints.post": steps,
            }
        )
    return gpt.replace(**over)


def gpt_runs(ch: Chapter, cluster: str | None = None) -> dict[int, Path]:
    """{seed: folder} of the GPT runs beside the book's run (OUT/runs/gpt-NAME-seedS), each
    trained to its last step on the book's Dask cluster; nothing trains when all are complete."""
    gpt = with_device(gpt_profile(ch.cfg))
    run_profile_jobs(gpt, train_seed, gpt_jobs(gpt, ch.run_dir), cluster)
    return gpt_run_dirs(gpt, ch.run_dir)


def idle_work(cfg: Profile, run_dir: Path) -> list[tuple]:
    """Work for a worker the book's seeds leave idle: the GPT runs not yet complete, as
    `train_seed` tasks."""
    return [
        (train_seed, job, f"train-{job[1].name}") for job in gpt_jobs(with_device(gpt_profile(cfg)), run_dir)
    ]


def gpt_run_dirs(gpt: Profile, run_dir: Path) -> dict[int, Path]:
    """{seed: folder} of the runs of `gpt` (`gpt_profile`) beside the book's run `run_dir`."""
    return {s: Path(run_dir).parent / run_name(gpt.name, s) for s in gpt.analysis.seeds}


def gpt_jobs(gpt: Profile, run_dir: Path) -> list[tuple[Profile, Path, None]]:
    """`train_seed` arguments (profile, folder, None) of the incomplete runs of `gpt`, its device resolved."""
    seeded = {s: gpt.replace(seed=s) for s in gpt.analysis.seeds}
    return [
        (seeded[s], d, None) for s, d in gpt_run_dirs(gpt, run_dir).items() if not is_complete(seeded[s], d)
    ]


def gpt_curves(runs: dict[int, Path]) -> dict[int, pd.DataFrame]:
    return {s: load_metrics(d) for s, d in runs.items()}


def loss_figure(ch: Chapter, curves: dict[int, pd.DataFrame]):
    """GPT's L (each seed) and L_obs, L_mask (seed 1) beside the book's BERT run, against
    steps and against matrices seen."""
    gpt = gpt_profile(ch.cfg)
    return closed(
        gpt_loss_curves(
            curves,
            ch.metrics,
            ch.cfg.data.rank,
            gpt.train.batch,
            ch.cfg.train.batch,
            drops={s: _drop(m, ch) for s, m in curves.items()},
            bert_drop=ch.drop,
        )
    )


def _drop(m: pd.DataFrame, ch: Chapter) -> int | None:
    s = shape(m, ch.cfg.data.rank, "L")
    return None if s is None else s.drop


def shapes_shown(ch: Chapter, curves: dict[int, pd.DataFrame]):
    """Per GPT seed: drop in L, plateau and fall (`mclib.analyses.sharpness`), final L_obs and
    L_mask over E[X²]; the same for the book's BERT run in L_mask."""
    level = copy_level(ch.cfg.data.rank)
    table = shapes_table({f"GPT seed {s}": m for s, m in curves.items()}, ch.cfg.data.rank, "L")
    table = table.rename(columns={"final L": "final L / E[X²]"})
    table["final L / E[X²]"] = table["final L / E[X²]"] / level
    table["final L_obs / E[X²]"] = [float(last_tenth(m)["L_obs"].mean()) / level for m in curves.values()]
    table["final L_mask / E[X²]"] = [float(last_tenth(m)["L_mask"].mean()) / level for m in curves.values()]
    bert = shapes_table(
        {f"BERT seed {ch.cfg.seed} (the book's run; its drop in L_mask)": ch.metrics},
        ch.cfg.data.rank,
        "L_mask",
    )
    bert = bert.rename(columns={"final L_mask": "final L_mask / E[X²]"})
    bert["final L_mask / E[X²]"] = bert["final L_mask / E[X²]"] / level
    bert["final L_obs / E[X²]"] = float(last_tenth(ch.metrics)["L_obs"].mean()) / level
    shown = pd.concat([table, bert], ignore_index=True)
    return (
        shown.style.hide(axis="index")
        .format(precision=3, na_rep="—")
        .set_caption(
            f"Each GPT run's drop in L, its plateau (steps on the copying level E[X²] before it) and "
            f"fall (steps from leaving the plateau to within 2× the final level), and its final losses "
            f"over E[X²] = {level:.3f}; the book's BERT run below, its drop read in L_mask. A drop is "
            f"sudden here when the plateau lasts longer than the fall (plateau / fall > {ABRUPT:g})."
        )
    )


def attention_maps(ch: Chapter, folder: Path, step: int, n_matrices: int = 64) -> np.ndarray:
    """`[layer, head, query, key]`: the GPT's attention at `step`, averaged over a fixed batch."""
    model = load_checkpoint(folder, step)
    batch = sample_eval_batch(ch.cfg.data, n_matrices, ch.cfg.analysis.seed)
    with torch.no_grad():
        att = model.attentions(batch.to(next(model.parameters()).device))
    return np.stack([a.mean(0).float().cpu().numpy() for a in att])


def before_after(ch: Chapter, folder: Path, m: pd.DataFrame) -> tuple[int, int]:
    """The saved steps shown: the last one on the plateau (before leaving it), and the last."""
    saved = saved_steps(folder)
    s = shape(m, ch.cfg.data.rank, "L")
    on = [t for t in saved if s is not None and t <= s.left]
    return (on[-1] if on else saved[0]), saved[-1]


def attention_figure(ch: Chapter, runs: dict[int, Path], curves: dict[int, pd.DataFrame]):
    seed = next(iter(runs))
    pre, post = before_after(ch, runs[seed], curves[seed])
    maps = [attention_maps(ch, runs[seed], t) for t in (pre, post)]
    layers, heads = maps[0].shape[:2]
    grid = np.stack([maps[i][layer] for i in range(2) for layer in range(layers)])  # [2·layers, heads, q, k]
    labels = [f"step {t:,}, layer {layer + 1}" for t in (pre, post) for layer in range(layers)]
    n2 = ch.cfg.data.n**2
    return closed(
        attention_grid(
            grid,
            row_labels=labels,
            col_labels=[f"head {h + 1}" for h in range(heads)],
            n=n2,
            title=f"GPT seed {seed}: attention before (step {pre:,}) and after (step {post:,}) its drop",
            key_marks=[n2],
        )
    )


def readings(ch: Chapter, curves: dict[int, pd.DataFrame]) -> tuple[dict, list[dict]]:
    """(glue, rows): the closing sentences and E19's three direction rows: plateau / fall above
    ABRUPT, final L_obs / E[X²] below COPIES, final L_mask / E[X²] above COMPLETES."""
    rank, level = ch.cfg.data.rank, copy_level(ch.cfg.data.rank)
    shapes = {s: shape(m, rank, "L") for s, m in curves.items()}
    ratios = [0.0 if v is None else v.ratio for v in shapes.values()]
    obs = [float(last_tenth(m)["L_obs"].mean()) / level for m in curves.values()]
    mask = [float(last_tenth(m)["L_mask"].mean()) / level for m in curves.values()]
    spread = lambda xs: float(np.std(xs, ddof=1)) if len(xs) > 1 else None
    dropped = [s for s, v in shapes.items() if v is not None]
    rows = [
        claim(
            "E19",
            "GPT: plateau steps / fall steps (a plateau, then a sudden drop in L)",
            float(np.mean(ratios)),
            f"{len(dropped)} of {len(shapes)} seeds drop in L; a seed without a drop counts 0; "
            f"sudden: > {ABRUPT:g} (the book's cut-off)",
            kind="direction",
            reference=ABRUPT,
            sense="above",
            spread=spread(ratios),
            margin=CUT,
        ),
        claim(
            "E19",
            "GPT: final L_obs / E[X²] (after the drop it copies the observed entries)",
            float(np.mean(obs)),
            f"copies: below {COPIES:g} (mclib.core.metrics.COPIES)",
            kind="direction",
            reference=COPIES,
            sense="below",
            spread=spread(obs),
            margin=CUT,
        ),
        claim(
            "E19",
            "GPT: final L_mask / E[X²] (the masked entries stay near the copying level)",
            float(np.mean(mask)),
            f"not completed: above {COMPLETES:g} (find_drop's half-way line); BERT's run ends at "
            f"{float(last_tenth(ch.metrics)['L_mask'].mean()) / level:.3f}",
            kind="direction",
            reference=COMPLETES,
            sense="above",
            spread=spread(mask),
            margin=CUT,
        ),
    ]
    drops = ", ".join(f"seed {s}: " + (f"step {v.drop:,}" if v else "no drop") for s, v in shapes.items())
    found = {
        "gpt_drops": drops,
        "gpt_ratio": f"{np.mean(ratios):.1f}",
        "gpt_obs": f"{np.mean(obs):.3f}",
        "gpt_mask": f"{np.mean(mask):.3f}",
    }
    return found, rows


def scorecard_table(ch: Chapter, rows: list[dict]):
    """The rows, recorded (`recorded_table`), with their verdicts."""
    return recorded_table(ch.run_dir, rows, CHAPTER)


def closing(table) -> str:
    """The closing sentence, each claim worded by its recorded row's verdict (`agreement`)."""
    said = [
        "sits on a plateau and then drops suddenly",
        "copies the observed entries after its drop",
        "leaves the masked entries near the copying level",
    ]
    return " ".join(f"That the GPT {text}: {agreement(v)}." for text, v in zip(said, table.data["verdict"]))


# What this chapter declares to the machinery (mclib.book.spec; collected by mclib.chapters.registry).
SPEC = ChapterSpec(CHAPTER, idle_work=idle_work)
