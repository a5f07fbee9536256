"""FLOPs of the model, counted in one place (used by benchmarks/train_step.py and docs/performance.md).

What is counted: the matrix multiplications, 2 FLOPs (one multiply, one add) per
multiply-accumulate. Per token, one forward pass through `MatrixBert` costs

    2 · N_mm                   every weight matrix: per layer Q, K, V, output (4 h²) and
                               the two MLP matrices (2 h·i), plus the read-out (h)
  + 4 · layers · s · h         attention scores Q Kᵀ (2 s h) and the weighted sum A V (2 s h),
                               summed over heads (heads · d_head = h), s = n² tokens

and training costs 3× the forward (the backward computes two matmuls per forward
matmul: the gradient of the input and of the weight; for attention the gradients of
Q, K and V and of the scores, again twice the forward). So, with T = batch · n² tokens,

    train_step_flops = 3 · T · (2 · N_mm + 4 · layers · n² · hidden)

Not counted (all O(T · h) or less, under 1 % here): the embedding look-ups and their
scatter-add gradient, biases, layer norms, GELU, softmax, the loss and Adam's update.
The count equals what `torch.utils.flop_counter.FlopCounterMode` reports for a
forward + backward pass (tests/test_flops.py).
"""
from __future__ import annotations

from .config import ModelConfig


def matmul_params(cfg: ModelConfig) -> int:
    """N_mm: weights that multiply activations (no embeddings, biases or layer norms)."""
    h, i = cfg.hidden, cfg.intermediate
    return cfg.layers * (4 * h * h + 2 * h * i) + h


def forward_flops(cfg: ModelConfig, n: int, batch: int) -> int:
    """Matmul FLOPs of one forward pass on `batch` n×n matrices (s = n² tokens each)."""
    s = n * n
    tokens = batch * s
    return tokens * (2 * matmul_params(cfg) + 4 * cfg.layers * s * cfg.hidden)


def train_step_flops(cfg: ModelConfig, n: int, batch: int) -> int:
    """Forward + backward = 3 × forward; the FLOPs of one training step."""
    return 3 * forward_flops(cfg, n, batch)


def authors_step_flops(cfg: ModelConfig, n: int, batch: int, eval_batch: int = 64) -> int:
    """The authors' step: a training step, then a forward pass on the same batch after the
    update and one on `eval_batch` fresh matrices (docs/protocol.md, §1.4)."""
    return train_step_flops(cfg, n, batch) + forward_flops(cfg, n, batch) + forward_flops(cfg, n, eval_batch)


def train_memory_bytes(profile) -> int:
    """Bytes a training run of `profile` holds at its peak, estimated (an upper bound, for
    refusing a run that cannot fit before it starts; not a measurement): fp32 weights,
    gradients and Adam's two moments (16 bytes a parameter), plus the activations the
    backward keeps, per layer 4 bytes × (T·(8·hidden + 2·intermediate) + 2·batch·heads·s²)
    with s = n² tokens a matrix and T = batch·s (the inputs of the four attention
    products, the two layer norms and the MLP, and the attention scores and probabilities
    as eager attention keeps them; sdpa keeps less)."""
    m, d, t = profile.model, profile.data, profile.train
    s = d.n * d.n
    tokens = t.batch * s
    embeddings = (2002 + s + 1) * m.hidden
    params = matmul_params(m) + embeddings + m.layers * (4 * m.hidden + m.intermediate + 4 * m.hidden)
    per_layer = tokens * (8 * m.hidden + 2 * m.intermediate) + 2 * t.batch * m.heads * s * s
    return 16 * params + 4 * m.layers * per_layer
