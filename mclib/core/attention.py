"""mclib's attention function, registered with transformers as the implementation "mclib".

BERT's eager attention with two hook points (transformers 5.x's sdpa returns no
probabilities and has no head_mask), for the object attached to the module as `mclib_hooks`
(`mclib.core.hooks`: `blocks.{l}.attn.hook_pattern`, `blocks.{l}.attn.hook_z`):

    probs = softmax(q kᵀ · scaling + mask [+ bias])   [batch, head, query, key]
    probs = hooks.pattern(layer, probs)
    z     = hooks.z(layer, probs @ v)                 [batch, head, query, d_head]

With no hooks it is exactly the eager attention. The attention bias (after Gopalani & Hu
2025, docs/protocol.md §5), set on the modules by `MatrixBert`, adds a constant `strength` b
to every query's logits toward its target keys (`bias_keys`: "row_col", the other keys of its
row and column, or "other", the control), in every head and layer: it multiplies those keys'
unnormalised weights by c = e^b. `position_masks` are the key sets chapter 03 scores heads with.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

IMPL = "mclib"
BIAS_TARGETS = ("row_col", "other")  # model.attn_bias_target


def position_masks(n: int) -> dict[str, torch.Tensor]:
    """`[n², n²]` bool key sets per query, for positions read row by row (p is row p // n,
    column p % n): same row (not itself), same column (not itself), itself."""
    pos = torch.arange(n * n)
    row, col = pos // n, pos % n
    eye = torch.eye(n * n, dtype=torch.bool)
    return {
        "row": (row[:, None] == row[None]) & ~eye,
        "column": (col[:, None] == col[None]) & ~eye,
        "self": eye,
    }


def bias_keys(n: int, target: str) -> torch.Tensor:
    """`[n², n²]` bool: the keys each query's bias goes to. "row_col": the other keys of its
    row and column; "other": the keys in neither its row nor its column."""
    if target not in BIAS_TARGETS:
        raise ValueError(f"attention bias target {target!r} is not one of {', '.join(BIAS_TARGETS)}")
    keys = position_masks(n)
    row_col = keys["row"] | keys["column"]
    return row_col if target == "row_col" else ~(row_col | keys["self"])


@functools.lru_cache(maxsize=16)
def _bias(n: int, target: str, strength: float) -> torch.Tensor:
    return bias_keys(n, target).float() * strength


def logit_bias(n: int, target: str, strength: float, device=None, dtype=torch.float32) -> torch.Tensor:
    """`[n², n²]`: `strength` where `bias_keys(n, target)`, 0 elsewhere; what the logits get."""
    return _bias(n, target, float(strength)).to(device=device, dtype=dtype)


def mclib_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
):
    """BERT's eager attention with hook points. q, k, v: `[batch, head, seq, d_head]`.

    Returns `(z [batch, query, head, d_head], probs [batch, head, query, key])`, the
    layout BertSelfAttention expects from any attention implementation.
    """
    scaling = query.size(-1) ** -0.5 if scaling is None else scaling  # module.scaling, passed by BERT
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # [batch, head, query, key]
    if attention_mask is not None:
        scores = scores + attention_mask  # 0 or dtype min, [batch, 1, query, key]
    strength = getattr(module, "attn_bias", 0.0)  # model.attn_bias, set by MatrixBert on every layer
    if strength:
        scores = scores + logit_bias(
            module.matrix_n, module.attn_bias_target, strength, scores.device, scores.dtype
        )  # [query, key]
    probs = nn.functional.softmax(scores, dim=-1)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)

    hooks = getattr(module, "mclib_hooks", None)
    layer = module.layer_idx
    if hooks is not None:
        probs = hooks.pattern(layer, probs)
    z = torch.matmul(probs, value)  # [batch, head, query, d_head]
    if hooks is not None:
        z = hooks.z(layer, z)
    return z.transpose(1, 2).contiguous(), probs


# Registered once, at import. The mask function must be registered too: for a name
# missing from AttentionMaskInterface, BertModel silently drops any attention_mask
# (masking_utils._preprocess_mask_arguments returns None). eager_mask gives the
# additive 4-D mask, or None for the all-ones mask this project always uses.
AttentionInterface.register(IMPL, mclib_attention)
AttentionMaskInterface.register(IMPL, eager_mask)
