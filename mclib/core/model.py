"""The model: HuggingFace `BertModel` (no pooler) + a linear read-out on every token.

Faithful details (docs/protocol.md, §1.3), each tested in tests/test_model.py:
- no token-type contribution: the single token-type embedding is zero and frozen;
- MASK (id 0) is the padding index: its embedding is zero and receives no gradient;
- the attention mask is all ones (masked tokens are attended to like any other);
- the read-out keeps PyTorch's default `nn.Linear` init (BERT's 0.02 normal init
  is applied to everything else).

The follow-up's intervention (the attention bias) lives in the config, so that `from_pretrained` rebuilds it:
`attn_bias` (a strength >= 0) and
`attn_bias_target` add a constant to every head's attention logits toward the query's own
row and column (or, the control, toward the other keys); `mclib.core.attention` says how.
A model with a strength above 0 runs mclib's attention function; at 0 it is the paper's
model, unchanged.

A checkpoint saved before c508192 (2026-11-26) removed the CPU search's levers has `attn_logit_scale`,
`position_init_std` and `qk_norm` in its config.json; `load_model` loads it while they are
off (1.0, null, false) and refuses it in one line otherwise (`REMOVED_LEVERS`).
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn
from transformers import BertConfig, BertModel, BertPreTrainedModel
from transformers.utils import CONFIG_NAME

from .attention import IMPL  # importing it registers mclib's attention function
from .config import ModelConfig
from .console import no_hf_progress_bars
from .data import MASK_ID, VOCAB_SIZE, Batch


def bert_config(cfg: ModelConfig, n: int) -> BertConfig:
    return BertConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=cfg.hidden,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        intermediate_size=cfg.intermediate,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        max_position_embeddings=n * n,
        type_vocab_size=1,
        initializer_range=cfg.init_std,
        layer_norm_eps=1e-12,
        pad_token_id=MASK_ID,
        attn_bias=cfg.attn_bias,
        attn_bias_target=cfg.attn_bias_target,
        matrix_n=n,
    )


class MatrixBert(BertPreTrainedModel):
    """`tokens [batch, n*n] -> predictions [batch, n*n]` (one real number per entry)."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.readout = nn.Linear(config.hidden_size, 1)
        self.bert.embeddings.token_type_embeddings.weight.requires_grad_(False)
        for layer in self.bert.encoder.layer:
            attn = layer.attention.self
            if getattr(config, "attn_bias", 0.0):  # read by mclib_attention: a constant, not a parameter
                attn.attn_bias, attn.attn_bias_target = config.attn_bias, config.attn_bias_target
                attn.matrix_n = config.matrix_n
        self.post_init()
        # BertModel initialises its own sub-modules (our _init_weights is not called for
        # them), so the deviation from its init is applied here, after it.
        with torch.no_grad():
            self.bert.embeddings.token_type_embeddings.weight.zero_()

    def _init_weights(self, module):
        if module is self.readout:
            return  # keep PyTorch's default nn.Linear init, as the authors' code does
        super()._init_weights(module)

    def forward(self, tokens: torch.Tensor, **kwargs) -> torch.Tensor:
        # All-ones attention mask and zero token types: passing none gives exactly that.
        hidden = self.bert(input_ids=tokens, **kwargs).last_hidden_state  # [batch, seq, hidden]
        return self.readout(hidden).squeeze(-1)                            # [batch, seq]

    def hidden_states(self, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Embedding output and every layer's output, each `[batch, seq, hidden]`."""
        return self.bert(input_ids=tokens, output_hidden_states=True).hidden_states


def matrix_n(model) -> int:
    """n of the n×n matrices a model was built for (`bert_config` stores it as matrix_n)."""
    n = getattr(model.config, "matrix_n", None)
    if n is None:
        raise ValueError("the model's config has no matrix_n: not a model built by mclib.core.model")
    return n


@contextlib.contextmanager
def eval_mode(model):
    """Eval mode and no gradients inside the block; the model's mode is restored after it."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def predict(model, batch: Batch) -> torch.Tensor:
    """`[batch, n, n]`: the model's values for `batch` (BERT reads the masked tokens; E19's
    teacher-forced GPT, `mclib.core.gpt`, the whole batch): what the training step and its
    evaluation call (`mclib.core.step`)."""
    if getattr(model, "teacher_forced", False):
        return model(batch)
    return model(batch.tokens).view_as(batch.x)



def build_model(cfg: ModelConfig, n: int, seed: int) -> MatrixBert:
    """A freshly initialised model; the seed fixes the init. `model.kind: gpt` builds
    E19's decoder (`mclib.core.gpt.MatrixGPT`) instead."""
    if cfg.kind != "gpt":
        torch.manual_seed(seed)
        config = bert_config(cfg, n)
        config._attn_implementation = attention_for(config, cfg.attention)
        return MatrixBert(config)
    from .gpt import build_gpt
    return build_gpt(cfg, n, seed)


def attention_for(config: BertConfig, wanted: str) -> str:
    """The attention implementation a model runs: `wanted` ("sdpa", "eager"), except that a
    model with an attention bias needs mclib's own attention function, the one that applies it."""
    return IMPL if getattr(config, "attn_bias", 0.0) else wanted


# config.json keys of the levers that c508192 removed (mclib.core.config.REMOVED; the last
# revision that has them: c6ddcac), each at the value that built the paper's model.
REMOVED_LEVERS = {"attn_logit_scale": 1.0, "position_init_std": None, "qk_norm": False}


def load_model(path, attention: str = "sdpa") -> MatrixBert:
    """A saved model (a folder with config.json + model.safetensors), in eval mode: a
    `MatrixBert`, or a `MatrixGPT` where config.json says gpt2."""
    import json
    from pathlib import Path

    if json.loads((Path(path) / CONFIG_NAME).read_text()).get("model_type") == "gpt2":
        from .gpt import load_gpt
        return load_gpt(path)
    config = BertConfig.from_pretrained(path)
    for key, off in REMOVED_LEVERS.items():
        if getattr(config, key, off) != off:
            raise ValueError(f"{path}: {CONFIG_NAME} has {key} = {getattr(config, key)!r}, a lever removed after "
                             f"revision c6ddcac; load this checkpoint there (git checkout c6ddcac)")
    with no_hf_progress_bars():
        model = MatrixBert.from_pretrained(path, attn_implementation=attention_for(config, attention))
    # from_pretrained turns requires_grad back on; the token types stay frozen.
    model.bert.embeddings.token_type_embeddings.weight.requires_grad_(False)
    return model.eval()
