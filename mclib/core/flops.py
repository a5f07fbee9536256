"""FLOPs of a `MatrixBert` training step, counted in one place (benchmarks/train_step.py,
docs/performance.md).

Matmuls only, 2 FLOPs per multiply-accumulate; with N_mm the weights that multiply
activations (`matmul_params`), s = n² tokens a matrix and T = batch · s tokens:

    train_step_flops = 3 · T · (2 · N_mm + 4 · layers · s · hidden)

(the backward is twice the forward). Not counted, all under 1 %: embeddings, biases, layer
norms, GELU, softmax, the loss, Adam. tests/test_flops.py checks the count against
`torch.utils.flop_counter.FlopCounterMode`.
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
    """A training step plus forward passes on the batch after the update and on `eval_batch` fresh
    matrices."""
    return train_step_flops(cfg, n, batch) + forward_flops(cfg, n, batch) + forward_flops(cfg, n, eval_batch)


def train_memory_bytes(profile) -> int:
    """Peak bytes of a training run of `profile`, an upper-bound estimate for refusing runs that
    cannot fit: 16 bytes a parameter (weights, gradients, Adam's two moments) plus, per layer,
    4 bytes × (T·(8·hidden + 2·intermediate) + 2·batch·heads·s²) of kept activations
    (s = n², T = batch·s; eager attention's scores and probabilities included)."""
    m, d, t = profile.model, profile.data, profile.train
    s = d.n * d.n
    tokens = t.batch * s
    embeddings = (2002 + s + 1) * m.hidden
    params = matmul_params(m) + embeddings + m.layers * (4 * m.hidden + m.intermediate + 4 * m.hidden)
    per_layer = tokens * (8 * m.hidden + 2 * m.intermediate) + 2 * t.batch * m.heads * s * s
    return 16 * params + 4 * m.layers * per_layer
