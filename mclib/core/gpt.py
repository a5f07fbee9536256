"""E19's GPT: a causal decoder (transformers' GPT-2 classes) that reads the masked matrix, a
separator, then the full matrix, and predicts each entry of the full matrix, teacher-forced.

    tokens  [batch, 2·n² + 1]: masked matrix (MASK_ID where masked), SEP (position n²), X
    values  [batch, n, n]: the read-out at positions n² … 2·n² - 1 (position n² + k predicts entry k)

Its loss is the BERT chapters' MSE on values (L, L_obs over the entries observed in the prompt,
L_mask over the masked ones), where the paper uses cross-entropy over tokens, so that the two
models' losses are the same quantities (chapter 08). BERT's vocabulary plus SEP_ID =
VOCAB_SIZE; no dropout; a checkpoint is an HF folder.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GPT2Config, GPT2Model, GPT2PreTrainedModel

from .config import ModelConfig
from .console import no_hf_progress_bars
from .data import VOCAB_SIZE, Batch, tokenize

SEP_ID = VOCAB_SIZE


def gpt_config(cfg: ModelConfig, n: int) -> GPT2Config:
    return GPT2Config(
        vocab_size=VOCAB_SIZE + 1,
        n_positions=2 * n * n + 1,
        n_embd=cfg.hidden,
        n_layer=cfg.layers,
        n_head=cfg.heads,
        n_inner=cfg.intermediate,
        activation_function="gelu",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        initializer_range=cfg.init_std,
        matrix_n=n,
        bos_token_id=SEP_ID,
        eos_token_id=SEP_ID,
    )


def prompt(batch: Batch) -> torch.Tensor:
    """`[batch, 2·n² + 1]`: the masked matrix's tokens, SEP, then the full matrix's tokens."""
    full = tokenize(batch.x).flatten(1)
    sep = torch.full_like(full[:, :1], SEP_ID)
    return torch.cat([batch.tokens, sep, full], dim=1)


class MatrixGPT(GPT2PreTrainedModel):
    """`Batch -> values [batch, n, n]`: the teacher-forced predictions of the full matrix."""

    teacher_forced = True  # the training step hands it the whole batch (`mclib.core.model.predict`)

    def __init__(self, config: GPT2Config):
        super().__init__(config)
        self.gpt = GPT2Model(config)
        self.readout = nn.Linear(config.n_embd, 1)
        self.post_init()

    def _init_weights(self, module):
        if module is self.readout:
            return  # PyTorch's default nn.Linear init, as MatrixBert's read-out
        super()._init_weights(module)

    def forward(self, batch: Batch, **kwargs) -> torch.Tensor:
        n2 = batch.tokens.shape[1]
        hidden = self.gpt(input_ids=prompt(batch), **kwargs).last_hidden_state  # [batch, 2n²+1, hidden]
        return self.readout(hidden[:, n2 : 2 * n2]).squeeze(-1).view_as(batch.x)  # SEP … entry n² - 2

    def attentions(self, batch: Batch) -> tuple[torch.Tensor, ...]:
        """Each layer's attention `[batch, head, query, key]` over the whole prompt (eager attention)."""
        impl = self.config._attn_implementation
        self.config._attn_implementation = "eager"
        try:
            return self.gpt(input_ids=prompt(batch), output_attentions=True).attentions
        finally:
            self.config._attn_implementation = impl


def build_gpt(cfg: ModelConfig, n: int, seed: int) -> MatrixGPT:
    """A freshly initialised GPT; the seed fixes the init."""
    torch.manual_seed(seed)
    config = gpt_config(cfg, n)
    config._attn_implementation = "sdpa"
    return MatrixGPT(config)


def load_gpt(path) -> MatrixGPT:
    with no_hf_progress_bars():
        return MatrixGPT.from_pretrained(path, attn_implementation="sdpa").eval()
