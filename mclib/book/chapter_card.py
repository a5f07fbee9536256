"""The model card of an analysis checkpoint (`model_card`, written beside its weights by
`mclib.book.chapter.checkpoint_series_zip`): the task, the checkpoint's role in the run
(`checkpoint_roles`), its losses, the model and the code that loads it (`CARD_MODELS`), the
run's profile, and how to cite the book and the paper (`CITATION`, `PAPER_CITATION`).
"""

from __future__ import annotations

import pandas as pd

from ..core.card import card_data
from ..core.card import model_card as hub_card
from ..core.placement import CheckpointSteps
from ..core.runs import METRICS, PROFILE, checkpoint_dir

CITATION = "CITATION.cff"  # the book's citation, at the root of its repository
PAPER_CITATION = (
    "Gopalani, Lubana & Hu, Abrupt Learning in Transformers: A Case Study on Matrix Completion "
    "(NeurIPS 2024), https://arxiv.org/abs/2410.22244"
)
CARD_MODELS = {  # model.kind -> where its class lives, its name, what it wraps, the card's loading code
    "bert": (
        "mclib.core.model",
        "MatrixBert",
        "HuggingFace's BertModel",
        "import mclib.core.model  # registers MatrixBert (model_type matrix-bert) with transformers' Auto "
        "classes\n"
        "from transformers import AutoModel\n"
        "from mclib.core.data import make_batch\n\n"
        'model = AutoModel.from_pretrained("{folder}")   '
        "# the whole MatrixBert, read-out included, eval mode\n"
        "pred = model(make_batch(x, mask).tokens).logits   # {shape}",
    ),
    "gpt": (
        "mclib.core.gpt",
        "MatrixGPT",
        "HuggingFace's GPT2Model, teacher-forced",
        "from mclib.core.data import make_batch\n"
        "from mclib.core.gpt import MatrixGPT\n\n"
        'model = MatrixGPT.from_pretrained("{folder}").eval()\n'
        "pred = model(make_batch(x, mask))   # {shape}",
    ),
}
ROLES = {
    "pre": "pre-shift: on the copying plateau",
    "transition": "transition: around the drop",
    "post": "post-shift: the end of training",
}


def checkpoint_roles(steps: CheckpointSteps) -> dict[int, str]:
    """Each analysis checkpoint's step -> its role (`ROLES`), in step order."""
    roles = {s: ROLES["transition"] for s in steps.transition}
    roles[steps.pre], roles[steps.post] = ROLES["pre"], ROLES["post"]
    return dict(sorted(roles.items()))


def _step_losses(ch, step: int) -> tuple[dict, str]:
    """The run's metrics row at `step` (its losses, step and wall left out, NaN dropped) and that
    row as a markdown table, or a sentence saying the run has no row there."""
    row = ch.metrics[ch.metrics["step"] == step]
    cells = (
        {k: v for k, v in row.iloc[0].items() if k not in ("step", "wall") and pd.notna(v)}
        if len(row)
        else {}
    )
    losses = (
        (
            "| "
            + " | ".join(cells)
            + " |\n|"
            + "---|" * len(cells)
            + "\n| "
            + " | ".join(f"{v:.4g}" for v in cells.values())
            + " |"
        )
        if cells
        else f"{METRICS} has no row at step {step}."
    )
    return cells, losses


def model_card(ch, step: int) -> str:
    """The model card (README.md) of the checkpoint at `step` of the open chapter `ch`, a
    huggingface_hub `ModelCard`
    (`mclib.core.card`): its header the profile, seed, step, the weights' sha256 and eval_L_mask
    at that step (where the run evaluated there); its text the task, the step's role, its losses,
    the model, how to load it, the run's profile.yaml, and how to cite the book and the paper."""

    cfg, d, m = ch.cfg, ch.cfg.data, ch.cfg.model
    cells, losses = _step_losses(ch, step)
    drop = f"the run's drop is at step {ch.drop:,}" if ch.drop is not None else "the run did not drop"
    folder = checkpoint_dir(ch.run_dir, step).name
    module, cls, what, load = CARD_MODELS[m.kind]
    load = load.format(
        folder=folder, shape=f"[batch, {d.n * d.n}]" if m.kind == "bert" else f"[batch, {d.n}, {d.n}]"
    )
    fresh = cells.get("eval_L_mask")
    data = card_data(
        cfg,
        step,
        checkpoint_dir(ch.run_dir, step),
        l_mask=fresh,
        matrices=cfg.train.eval_batch if fresh is not None else None,
    )
    return str(
        hub_card(
            data,
            f"""# {cls}: {cfg.name} profile, seed {cfg.seed}, step {step:,}

A checkpoint of the book that reproduces {PAPER_CITATION}.

## Task

Low-rank matrix completion: {d.n}x{d.n} matrices of rank {d.rank} ({d.dist} factors), each entry masked
with probability {d.p_mask}. The model reads the {d.n * d.n} entries as tokens (a masked entry is token 0)
and outputs one number per entry; L is the squared error over all entries, L_obs over the observed
ones, L_mask over the masked ones.

## This checkpoint

Step {step:,} of the run {ch.run_dir.name} ({checkpoint_roles(ch.steps)[step]}); {drop}. Where
the analysis checkpoints sit: {ch.steps.note}. The run {ch.end.text}.

Its losses at step {step:,} (the run's {METRICS}: the training batch of that step; eval_* on a
held-out batch, where the run evaluated):

{losses}

The model: {m.layers} layers, {m.heads} heads, hidden {m.hidden}, intermediate {m.intermediate}
({what} and a linear read-out, {module}.{cls}).

## Load it

With mclib (the book's repository, `pip install -e .`):

```python
{load}
```

x `[batch, {d.n}, {d.n}]` float, mask `[batch, {d.n}, {d.n}]` bool (True = masked). The sha256 of the weights
is in the card's header (`mclib: weights_sha256`).

## The run's profile ({PROFILE})

```yaml
{(ch.run_dir / PROFILE).read_text().strip()}
```

## Cite

The book: {CITATION} at the root of its repository. The paper: {PAPER_CITATION}.
""",
        )
    )
