"""The model: HuggingFace `BertModel` (no pooler) + a linear read-out on every token.

As the paper's (docs/protocol.md, §1.3; tests/test_model.py): the one token-type embedding
is zero and frozen; MASK (id 0) is the padding index (zero embedding, no gradient); the
attention mask is all ones; the read-out keeps PyTorch's default `nn.Linear` init, all else
BERT's 0.02 normal init. The follow-up's attention bias (`attn_bias` > 0, `attn_bias_target`)
lives in the config, so `from_pretrained` rebuilds it, and runs mclib's attention function
(`mclib.core.attention`); at 0 the model is the paper's. `load_model` refuses, in one line, a
checkpoint whose config.json sets an old lever (`REMOVED_LEVERS`) away from its off value.

A Hugging Face model of its own: `MatrixBertConfig` (`model_type: matrix-bert`, a `BertConfig`
with mclib's fields, so the encoder is a stock `BertModel`) is registered with `AutoConfig` and
`AutoModel` when this module is imported, so `AutoModel.from_pretrained(folder)` returns the whole
`MatrixBert`, read-out included, without `trust_remote_code`. Not registered with
`AutoModelForMaskedLM`: its contract is logits over a vocabulary, where this model returns one
real number per entry. `forward(input_ids, attention_mask=None, labels=None)` returns a
`MatrixCompletionOutput` (`logits` `[batch, n*n]`; `loss`, the training step's L, where `labels`
are given). A folder saying `model_type: bert` (`LEGACY`, the format before 2026-11-29) loads
whole through `load_model` and `MatrixBert.from_pretrained`, with one line saying so.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import AutoConfig, AutoModel, BertConfig, BertModel, BertPreTrainedModel
from transformers.utils import CONFIG_NAME, ModelOutput
from transformers.utils.generic import can_return_tuple

from .attention import IMPL  # importing it registers mclib's attention function
from .config import ModelConfig
from .console import no_hf_progress_bars
from .data import MASK_ID, VOCAB_SIZE, Batch
from .gpt import build_gpt, load_gpt
from .metrics import squared_errors

log = logging.getLogger(__name__)

MODEL_TYPE = "matrix-bert"
# what the config.json of a checkpoint saved before 2026-11-29 says (beside its matrix_n)
LEGACY = {"model_type": "bert", "architectures": ["MatrixBert"]}


@strict
class MatrixBertConfig(BertConfig):
    """BERT's config (the encoder is a stock `BertModel`) with mclib's fields: `matrix_n`, the n
    of the n×n matrices, and the follow-up's attention bias (`attn_bias`, `attn_bias_target`)."""

    model_type = MODEL_TYPE

    matrix_n: int | None = None
    attn_bias: float | int = 0.0
    attn_bias_target: str = "row_col"


@dataclass
class MatrixCompletionOutput(ModelOutput):
    """What `MatrixBert.forward` returns. logits `[batch, n*n]`: the predicted value of every
    entry (a regression, not scores over a vocabulary); loss: L, the mean squared error over
    every entry against `labels`, as the training step computes it (`mclib.core.step.device_step`;
    None without labels); hidden_states, attentions: BertModel's, where asked for."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


def bert_config(cfg: ModelConfig, n: int) -> MatrixBertConfig:
    return MatrixBertConfig(
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
    """`input_ids [batch, n*n] -> MatrixCompletionOutput`, `.logits [batch, n*n]`: one real number
    per entry."""

    config_class = MatrixBertConfig

    def __init__(self, config: MatrixBertConfig):
        if getattr(config, "attn_bias", 0.0):  # only mclib's attention function applies the bias
            config._attn_implementation = IMPL
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

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs,
    ) -> MatrixCompletionOutput:
        """input_ids `[batch, n*n]`; attention_mask: None, the paper's (every token attends to
        every other, masked ones too); labels: the true values `[batch, n*n]` or `[batch, n, n]`.
        Other keyword arguments go to BertModel (output_hidden_states, output_attentions, ...)."""
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        logits = self.readout(out.last_hidden_state).squeeze(-1)  # [batch, seq]
        loss = None
        if labels is not None:
            if labels.numel() != logits.numel():
                raise ValueError(
                    f"labels of shape {tuple(labels.shape)} do not fit the predictions "
                    f"{tuple(logits.shape)}: one true value per entry"
                )
            loss = (
                squared_errors(logits[None], labels[None]).mean(1).sum()
            )  # L, as device_step differentiates it
        return MatrixCompletionOutput(
            loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions
        )

    def hidden_states(self, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Embedding output and every layer's output, each `[batch, seq, hidden]`."""
        return self.bert(input_ids=tokens, output_hidden_states=True).hidden_states

    @classmethod
    def from_pretrained(cls, path, *args, config=None, **kwargs):
        """transformers' `from_pretrained`, with a local folder saved before 2026-11-29 (`LEGACY`)
        read whole (`read_config`), and the token-type embedding frozen again (loading turns
        every parameter's requires_grad back on)."""
        if config is None and (Path(path) / CONFIG_NAME).is_file():
            config = read_config(path)
        model = super().from_pretrained(path, *args, config=config, **kwargs)
        model.bert.embeddings.token_type_embeddings.weight.requires_grad_(False)
        return model


AutoConfig.register(MODEL_TYPE, MatrixBertConfig, exist_ok=True)
AutoModel.register(MatrixBertConfig, MatrixBert, exist_ok=True)


_said_legacy: list[str] = []  # the first folder of the old format loaded in this process


def read_config(path) -> MatrixBertConfig:
    """The `MatrixBertConfig` of a checkpoint folder. One saved before 2026-11-29 (config.json
    says `LEGACY`, with a matrix_n) is read as one, said once per process in one line; a folder
    of another architecture is a one-line ValueError naming what it says."""
    path = Path(path)
    saved = json.loads((path / CONFIG_NAME).read_text())
    kind = saved.get("model_type")
    if kind == MODEL_TYPE:
        return MatrixBertConfig.from_pretrained(path)
    if any(saved.get(k) != v for k, v in LEGACY.items()) or "matrix_n" not in saved:
        raise ValueError(
            f"{path / CONFIG_NAME}: model_type {kind!r}, architectures {saved.get('architectures')!r}: "
            f"not a MatrixBert (model_type {MODEL_TYPE!r}, or {LEGACY['model_type']!r} with "
            f"architectures {LEGACY['architectures']!r} and a matrix_n)"
        )
    if not _said_legacy:
        _said_legacy.append(str(path))
        log.warning(
            "mclib: %s: %s has model_type 'bert', the format saved before 2026-11-29: read as "
            "a MatrixBert's, read-out included (AutoModel reads such a folder as a stock BertModel without "
            "it; saving it again writes model_type %r; further such folders are read without this line)",
            path,
            CONFIG_NAME,
            MODEL_TYPE,
        )
    return MatrixBertConfig.from_dict(
        {k: v for k, v in saved.items() if k not in ("model_type", "transformers_version")}
    )


def config_text(folder) -> str:
    """A checkpoint folder's config.json as `save_pretrained` writes it today: the file's text, or
    for a folder saved before 2026-11-29 (`LEGACY`) its `read_config`, which AutoModel loads whole."""
    text = (Path(folder) / CONFIG_NAME).read_text()
    if json.loads(text).get("model_type") != LEGACY["model_type"]:
        return text
    return read_config(folder).to_json_string(use_diff=True)


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
    teacher-forced GPT the whole batch)."""
    if getattr(model, "teacher_forced", False):
        return model(batch)
    return model(batch.tokens).logits.view_as(batch.x)


def build_model(cfg: ModelConfig, n: int, seed: int) -> MatrixBert:
    """A freshly initialised model; the seed fixes the init. `model.kind: gpt` builds
    E19's decoder (`mclib.core.gpt.MatrixGPT`) instead."""
    if cfg.kind != "gpt":
        torch.manual_seed(seed)
        config = bert_config(cfg, n)
        config._attn_implementation = attention_for(config, cfg.attention)
        return MatrixBert(config)
    return build_gpt(cfg, n, seed)


def attention_for(config: BertConfig, wanted: str) -> str:
    """The attention implementation a model runs: `wanted`, or mclib's own where it has an attention bias."""
    return IMPL if getattr(config, "attn_bias", 0.0) else wanted


# config.json keys of levers an older checkpoint may hold (mclib.core.config.REMOVED), each at
# the value that built the paper's model.
REMOVED_LEVERS = {"attn_logit_scale": 1.0, "position_init_std": None, "qk_norm": False}


def load_model(path, attention: str = "sdpa") -> MatrixBert:
    """A saved model (a folder with config.json + model.safetensors), in eval mode: a
    `MatrixBert` (also from a folder saved before 2026-11-29, `read_config`), or a `MatrixGPT`
    where config.json says gpt2."""
    if json.loads((Path(path) / CONFIG_NAME).read_text()).get("model_type") == "gpt2":
        return load_gpt(path)
    config = read_config(path)
    for key, off in REMOVED_LEVERS.items():
        if getattr(config, key, off) != off:
            raise ValueError(
                f"{path}: {CONFIG_NAME} has {key} = {getattr(config, key)!r}, a lever removed after "
                f"revision c6ddcac; load this checkpoint there (git checkout c6ddcac)"
            )
    with no_hf_progress_bars():
        model = MatrixBert.from_pretrained(
            path, config=config, attn_implementation=attention_for(config, attention)
        )
    return model.eval()
