"""mclib's attention function, registered with transformers as the implementation "mclib".

In transformers 5.x `head_mask` is gone and "sdpa" returns no probabilities, so a model
whose attention must be seen or changed is routed through this one function. It computes
BERT's eager attention

    probs = softmax(q kᵀ · scaling + mask)      [batch, head, query, key]
    z     = probs @ v                           [batch, head, query, d_head]

(with QK-LayerNorm first when the model has it, `model.qk_norm`: such a model always runs
this function, `model.attention_for`), and offers three hook points to the object attached
to the module as `mclib_hooks`, if any:

    probs = hooks._ablate(layer, probs)          between the two lines
    z     = hooks._patch(layer, z)               after the second
    hooks._capture(layer, probs, z)              then

With no hooks attached it is exactly the eager attention. The hooks themselves (capture,
ablation, patching) are analyses: `mclib.analyses.attention.AttentionHooks`.
"""
from __future__ import annotations

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

IMPL = "mclib"


def mclib_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, *, scaling: float | None = None,
                    dropout: float = 0.0, **kwargs):
    """BERT's eager attention with hook points. q, k, v: `[batch, head, seq, d_head]`.

    Returns `(z [batch, query, head, d_head], probs [batch, head, query, key])`, the
    layout BertSelfAttention expects from any attention implementation.
    """
    scaling = query.size(-1) ** -0.5 if scaling is None else scaling  # module.scaling, passed by BERT
    if hasattr(module, "q_norm"):  # QK-LayerNorm (model.qk_norm): normalise each head's queries and keys
        query, key = module.q_norm(query), module.k_norm(key)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling   # [batch, head, query, key]
    if attention_mask is not None:
        scores = scores + attention_mask                          # 0 or dtype min, [batch, 1, query, key]
    probs = nn.functional.softmax(scores, dim=-1)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)

    hooks = getattr(module, "mclib_hooks", None)
    layer = module.layer_idx
    if hooks is not None:
        probs = hooks._ablate(layer, probs)
    z = torch.matmul(probs, value)                                # [batch, head, query, d_head]
    if hooks is not None:
        z = hooks._patch(layer, z)
        hooks._capture(layer, probs, z)
    return z.transpose(1, 2).contiguous(), probs


# Registered once, at import. The mask function must be registered too: for a name
# missing from AttentionMaskInterface, BertModel silently drops any attention_mask
# (masking_utils._preprocess_mask_arguments returns None). eager_mask gives the
# additive 4-D mask, or None for the all-ones mask this project always uses.
AttentionInterface.register(IMPL, mclib_attention)
AttentionMaskInterface.register(IMPL, eager_mask)
