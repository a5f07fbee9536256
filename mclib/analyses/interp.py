"""mclib's checkpoints in nnsight (the optional extra `interp`; names, shapes and an example:
docs/interpretability.md).

    model = load_for_interp(checkpoint_dir(run_dir, step))   # a MatrixBert, eager attention, eval mode
    net = nnsight_model(model)                               # nnsight.NNsight(model)
    with net.trace(batch.tokens):
        probs = net.bert.encoder.layer[0].attention.self.output[1].save()   # [batch, head, query, key]
        mlp = net.bert.encoder.layer[0].E_output.dense.output.save()        # [batch, seq, hidden]
        pred = net.output.logits.save()                                     # [batch, n*n]
    nnsight_ablated_l_mask(net, batch, layer=1, head=0, mode="zero")        # L_mask with one head zeroed

Eager attention, because "sdpa" returns no pattern. `nnsight_ablated` reproduces mclib's own
head ablations (`mclib.analyses.attention`) through nnsight's names alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers.utils import CONFIG_NAME as CONFIG  # HuggingFace's config.json, in every checkpoint folder

from ..core.data import Batch
from ..core.metrics import losses
from ..core.model import LEGACY, MODEL_TYPE, MatrixBert, load_model

EXTRA = "interp"
MODES = ("zero", "uniform")
ARCHITECTURE = {"model_type": MODEL_TYPE, "architectures": ["MatrixBert"]}  # what mclib's config.json says
# (saved before 2026-11-29: model_type "bert", `mclib.core.model.LEGACY`, read the same way)


class InterpError(ValueError):
    """A folder or an input the interpretability loader cannot take (one line: what differs)."""


def architecture_differences(config: dict) -> list[str]:
    """What in a checkpoint's config.json differs from a MatrixBert's (empty: it is one), in
    either format (`ARCHITECTURE`, or `LEGACY` where it says model_type "bert")."""
    mine = LEGACY if config.get("model_type") == LEGACY["model_type"] else ARCHITECTURE
    diffs = [
        f"{key} {config.get(key)!r} (MatrixBert: {want!r})"
        for key, want in mine.items()
        if config.get(key) != want
    ]
    if "matrix_n" not in config:
        diffs.append("no matrix_n (the n of mclib's n x n matrices)")
    return diffs


def load_for_interp(folder: str | Path) -> MatrixBert:
    """The MatrixBert saved in `folder`, with "eager" attention, in eval mode, on the CPU.
    Raises InterpError, naming what differs, for another architecture, before any weight is read."""
    folder = Path(folder)
    if not (folder / CONFIG).is_file():
        raise InterpError(f"{str(folder)!r} is not a checkpoint folder: it has no {CONFIG}")
    diffs = architecture_differences(json.loads((folder / CONFIG).read_text()))
    if diffs:
        raise InterpError(f"{str(folder)!r} is not a MatrixBert checkpoint: {'; '.join(diffs)}")
    return load_model(folder, attention="eager").to("cpu")


def nnsight_model(model):
    """`nnsight.NNsight(model)`; without nnsight, one line naming the extra."""
    try:
        from nnsight import NNsight  # noqa: PLC0415 - an optional extra
    except ImportError:
        raise InterpError(
            f"nnsight is not installed: it is the optional extra {EXTRA!r} (pip install -e '.[{EXTRA}]')"
        ) from None
    return NNsight(model)


def head_columns(model, head: int) -> slice:
    """The columns of head `head` in a layer's concatenated per-head outputs
    `[batch, query, head * d_head]`."""
    heads = model.config.num_attention_heads
    if not 0 <= head < heads:
        raise InterpError(f"head {head} is out of range: the model has {heads} heads (0-indexed)")
    d_head = model.config.hidden_size // heads
    return slice(head * d_head, (head + 1) * d_head)


def nnsight_ablated(net, batch: Batch, layer: int, head: int, mode: str = "zero") -> torch.Tensor:
    """`[batch, n, n]` predictions of `net` (an `nnsight_model`) on `batch` with head (`layer`,
    `head`) zeroed ("zero": z = 0) or made uniform ("uniform": z = the mean of its values over the keys)."""
    if mode not in MODES:
        raise InterpError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    layers = net._module.config.num_hidden_layers
    if not 0 <= layer < layers:
        raise InterpError(f"layer {layer} does not exist: the model has {layers} layers (0-indexed)")
    cols = head_columns(net._module, head)
    attention = net.bert.encoder.layer[layer].attention.self
    with torch.no_grad(), net.trace(batch.tokens):
        if mode == "uniform":
            values = attention.value.output  # [batch, key, head * d_head]
            uniform = values[:, :, cols].mean(1, keepdim=True)  # every probability 1/seq
        z = attention.output[0]  # [batch, query, head * d_head]
        z[:, :, cols] = 0.0 if mode == "zero" else uniform
        pred = net.output.logits.save()  # [batch, seq]
    return pred.view_as(batch.x)


def nnsight_ablated_l_mask(net, batch: Batch, layer: int, head: int, mode: str = "zero") -> float:
    """L_mask of `nnsight_ablated`'s predictions."""
    return losses(nnsight_ablated(net, batch, layer, head, mode), batch.x, batch.mask)["L_mask"].item()
