"""Interventions on inputs, activations and weights: the copy check (E2), model switching
(E6), permuted positions (E7) and component re-initialisation (E15).

E6 and E7 are hooks (`mclib.core.hooks`, lists of (name, fn) for `hooks(model, ...)` or
`predict(model, batch, hooks=...)`); the model is never touched. E15 returns a changed
deep copy, since that copy is trained. Interventions on attention itself (ablation,
patching) live in mclib.analyses.attention.
"""

from __future__ import annotations

import copy
import re

import torch

from ..core.data import Batch, make_batch, round2
from ..core.hooks import Hook
from ..core.metrics import mse_to
from ..core.model import matrix_n

# --- E2: the copy check ------------------------------------------------------------------


def replace_masked_tokens(batch: Batch, value: float | None) -> Batch:
    """`batch` with every masked token replaced by `value`'s (None: the MASK token)."""
    return make_batch(batch.x, batch.mask, fill_value=value)


def l_prime_mask(pred: torch.Tensor, batch: Batch, value: float | None) -> float:
    """L'_mask: mean over masked entries of (X̂ − m)², m the value whose token filled the
    masks (0 for MASK). A model that copies its input has L'_mask ≈ 0."""
    m = 0.0 if value is None else float(round2(torch.tensor(float(value))))  # the token's value
    return mse_to(pred, torch.full_like(batch.x, m), batch.mask)


# --- E6: model switching -----------------------------------------------------------------

QKV = ("query", "key", "value")


def switch_qkv_hooks(target, source) -> list[Hook]:
    """Hooks with which `target` runs on `source`'s query, key and value weights and biases
    in every layer (not the attention output projection, not the layer norms): each
    `blocks.{l}.attn.hook_q/k/v` becomes `source`'s projection of the block's input
    (`blocks.{l}.hook_resid_pre`, kept by a hook of the same list, which comes first)."""
    t, s = target.config, source.config
    for key in ("num_hidden_layers", "num_attention_heads", "hidden_size"):
        if getattr(t, key) != getattr(s, key):
            raise ValueError(f"models differ in {key}: target {getattr(t, key)}, source {getattr(s, key)}")
    out = []
    for layer, src in enumerate(source.bert.encoder.layer):
        seen = {}
        out.append((f"blocks.{layer}.hook_resid_pre", lambda x, name, seen=seen: seen.update(x=x)))
        for short, name in zip("qkv", QKV):
            projection = getattr(src.attention.self, name)
            out.append(
                (
                    f"blocks.{layer}.attn.hook_{short}",
                    lambda h, name, seen=seen, projection=projection: projection(seen["x"]).view_as(h),
                )
            )
    return out


# --- E7: permuted positional embeddings ----------------------------------------------------


def n_positions(model) -> int:
    """n², the number of matrix entries: the position rows the model actually uses."""
    return matrix_n(model) ** 2


def position_permutation(n_pos: int, seed: int) -> torch.Tensor:
    """The seeded random permutation `permute_positions_hooks` applies, `[n_pos]` long."""
    return torch.randperm(n_pos, generator=torch.Generator().manual_seed(seed))


def permute_positions_hooks(model, seed: int) -> list[Hook]:
    """A hook on `hook_pos_embed` `[1, pos, d_model]` that reorders the position
    embeddings: position p gets the row of position perm[p], perm =
    position_permutation(n², seed)."""
    perm = position_permutation(n_positions(model), seed)

    def permute(table: torch.Tensor, name: str) -> torch.Tensor:
        if table.shape[1] != len(perm):
            raise ValueError(f"{name} has {table.shape[1]} positions, the permutation {len(perm)}")
        return table[:, perm.to(table.device)]

    return [("hook_pos_embed", permute)]


# --- E15: component re-initialisation ------------------------------------------------------

# The four groups of E15, by parameter name (full match). "attention" is query, key, value
# and the output projection (E6's switch takes only the first three); "mlp" the two
# feed-forward projections.
GROUPS = {
    "attention": r"bert\.encoder\.layer\.\d+\.attention\."
    r"(self\.(query|key|value)|output\.dense)\.(weight|bias)",
    "mlp": r"bert\.encoder\.layer\.\d+\.(intermediate|output)\.dense\.(weight|bias)",
    "positional": r"bert\.embeddings\.position_embeddings\.weight",
    "token": r"bert\.embeddings\.word_embeddings\.weight",
}
# Everything else is "other", always loaded and frozen: every layer norm, the read-out and
# the token-type row. (The authors' substring match on "attention" would also take the
# post-attention layer norm.)
OTHER = "other"


def group_of(name: str) -> str:
    matches = [g for g, pattern in GROUPS.items() if re.fullmatch(pattern, name)]
    if len(matches) > 1:  # cannot happen with the patterns above; guards future edits
        raise ValueError(f"parameter {name} matches several groups: {matches}")
    return matches[0] if matches else OTHER


def component_groups(model) -> dict[str, str]:
    """Every parameter name of `model` -> its E15 group, or "other"."""
    return {name: group_of(name) for name, _ in model.named_parameters()}


def reinit_component(model, group: str, seed: int):
    """A copy of `model` whose `group` is re-initialised (seeded) and trainable, every other
    parameter frozen. The init is BERT's own (`_init_weights`: normal(0, initializer_range)
    weights, zero biases, zero MASK row), not PyTorch's defaults."""
    if group not in GROUPS:
        raise ValueError(f"group {group!r} is not one of {', '.join(GROUPS)}")
    model = copy.deepcopy(model)
    groups = component_groups(model)
    owners = sorted({name.rsplit(".", 1)[0] for name, g in groups.items() if g == group})
    with torch.random.fork_rng(), torch.no_grad():  # seeded, without touching the global RNG
        torch.manual_seed(seed)
        for owner in owners:
            module = model.get_submodule(owner)
            for p in module.parameters(recurse=False):
                # Weights loaded by from_pretrained carry this flag, and HF's init
                # functions silently skip flagged tensors.
                if hasattr(p, "_is_hf_initialized"):
                    del p._is_hf_initialized
            model._init_weights(module)
    for name, p in model.named_parameters():
        p.requires_grad_(groups[name] == group)
    return model
