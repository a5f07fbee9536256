"""The fast training path: R runs of one architecture trained as one stacked model.

`MatrixBert` (HuggingFace) stays the model of record: checkpoints are its folders, and
every analysis reads it with its attention hooks. For training only, the weights of R
runs are stacked into tensors `[run, ...]`, and `forward` computes for every run at
once what `MatrixBert.forward` computes.

This file writes the architecture a second time (HF's `BertModel` with mclib's attention
function, `mclib.core.attention`, is the first), for speed. What keeps the two from
diverging is a test, not a shared definition: tests/test_stacked.py checks the forward
against MatrixBert's to 1e-5 under every field of `ModelConfig`, and fails when a field
is added that it does not list; a lever that only the HF path has (model.kind: gpt) is
refused here (`mclib.core.train.fast_path_refusal`) and trains on the reference path.

    tokens [run, batch, seq]
      -> token + position embeddings, LayerNorm              [run, batch*seq, hidden]
      -> per layer: fused QKV product, softmax attention,
         output projection + LayerNorm, GELU MLP + LayerNorm  [run, batch*seq, hidden]
      -> read-out                                             [run, batch, seq]

Why it is faster (docs/performance.md, benchmarks/train_step.py): one batched matrix
product (`baddbmm` over the run dimension) replaces R small ones; query, key and value
are one product; attention at head dimension 8 is two `bmm`s and a softmax, which beat
sdpa's CPU kernel at that size; Adam runs over a few stacked tensors.

Parameters keep their HuggingFace names, except that each layer's query, key and value
weights are stored fused, `...attention.self.qkv.{weight,bias}` ([run, 3*hidden, hidden]
and [run, 3*hidden], rows in the order query, key, value).
"""
from __future__ import annotations

import re

import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.adam import adam as adam_update  # torch's own Adam arithmetic, on a run's slices

from .attention import logit_bias
from .model import MatrixBert

QKV = re.compile(r"(.*\.attention\.self)\.(query|key|value)\.(weight|bias)$")
PARTS = ("query", "key", "value")
WORD = "bert.embeddings.word_embeddings.weight"
TOKEN_TYPE = "bert.embeddings.token_type_embeddings.weight"


def stacked_name(hf_name: str) -> str:
    """The stacked parameter that holds an HF parameter (q, k, v -> the fused qkv)."""
    m = QKV.match(hf_name)
    return f"{m.group(1)}.qkv.{m.group(3)}" if m else hf_name


def hf_slices(hf_name: str, hidden: int) -> tuple[str, slice]:
    """(stacked name, rows of it) that hold `hf_name` for one run."""
    m = QKV.match(hf_name)
    if not m:
        return hf_name, slice(None)
    i = PARTS.index(m.group(2))
    return stacked_name(hf_name), slice(i * hidden, (i + 1) * hidden)


class Stack(nn.Module):
    """The weights of R `MatrixBert` runs of one architecture, stacked on dimension 0.

    `trainable[name]` is a `[run]` bool: which runs train that parameter (all of them in
    a normal run; E15's runs freeze every group but one). A parameter no run trains is
    not a leaf that needs a gradient, so its backward is never computed.
    """

    def __init__(self, models: list[MatrixBert]):
        super().__init__()
        if not models:
            raise ValueError("a stack needs at least one model")
        cfg = models[0].config
        self.layers, self.heads, self.hidden = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.hidden_size
        self.eps = cfg.layer_norm_eps
        self.scaling = (self.hidden // self.heads) ** -0.5
        strength = getattr(cfg, "attn_bias", 0.0)  # model.attn_bias: the logits' constant [query, key], or None
        self.bias = (logit_bias(cfg.matrix_n, cfg.attn_bias_target, strength, models[0].device)
                     if strength else None)
        for m in models[1:]:
            arch = lambda c: (c.num_hidden_layers, c.num_attention_heads, c.hidden_size, c.intermediate_size,
                              c.max_position_embeddings, getattr(c, "attn_bias", 0.0),
                              getattr(c, "attn_bias_target", "row_col"))
            if arch(m.config) != arch(cfg):
                raise ValueError("models of different architectures cannot be stacked")
        for m in models:
            if m.bert.embeddings.token_type_embeddings.weight.abs().max() != 0:
                raise ValueError("the token-type embedding must be zero (it is frozen at zero in every run)")
        params, trainable = {}, {}
        for hf_name, _ in models[0].named_parameters():
            if hf_name == TOKEN_TYPE:
                continue  # zero and frozen: adding it changes nothing
            name = stacked_name(hf_name)
            flags = tuple(dict(m.named_parameters())[hf_name].requires_grad for m in models)  # host bools
            if name in trainable and trainable[name] != flags:
                raise ValueError(f"{hf_name}: query, key and value must be trained or frozen together")
            trainable[name] = flags
            if name not in params:
                params[name] = self._gather(models, name)
        self._register(params, trainable)

    def _register(self, params: dict[str, torch.Tensor], trainable: dict[str, tuple[bool, ...]]) -> None:
        """Make each stacked tensor a registered parameter of this module (so `.parameters()`,
        `.to()` and `state_dict()` are nn.Module's own); a name's dots become "/" (a
        registered name cannot hold a dot). `params` is the view by HF name that the forward reads."""
        self.names = list(params)
        self.trainable = trainable
        for n, p in params.items():
            self.register_parameter(n.replace(".", "/"), nn.Parameter(p, requires_grad=any(trainable[n])))
        self._view()

    def _view(self) -> None:
        self.params = {n.replace("/", "."): p for n, p in self._parameters.items()}

    def _apply(self, fn, recurse=True):  # .to(), .double(), ...: refresh the view by name after them
        out = super()._apply(fn, recurse)
        self._view()
        if self.bias is not None:  # a constant, not a parameter: moved with them
            self.bias = fn(self.bias)
        return out

    def _gather(self, models, name: str) -> torch.Tensor:
        with torch.no_grad():
            if name.endswith(".qkv.weight") or name.endswith(".qkv.bias"):
                base, kind = name.rsplit(".qkv.", 1)
                parts = [torch.cat([m.get_parameter(f"{base}.{p}.{kind}") for p in PARTS]) for m in models]
            else:
                parts = [m.get_parameter(name) for m in models]
            return torch.stack([p.detach().clone() for p in parts])

    @property
    def runs(self) -> int:
        return next(iter(self.params.values())).shape[0]

    def parameters_of(self, r: int) -> dict[str, torch.Tensor]:
        """Run r's slice of every parameter, as views (in-place updates reach the stack)."""
        return {n: p[r] for n, p in self.params.items()}

    @torch.no_grad()
    def copy_into(self, r: int, model: MatrixBert) -> MatrixBert:
        """Write run r's weights into an HF model of the same architecture (for saving)."""
        for hf_name, p in model.named_parameters():
            if hf_name == TOKEN_TYPE:
                continue
            name, rows = hf_slices(hf_name, self.hidden)
            p.copy_(self.params[name][r][rows])
        return model

    def select(self, keep: list[int]) -> "Stack":
        """A stack of only the runs `keep` (in that order); new leaf tensors."""
        new = Stack.__new__(Stack)
        nn.Module.__init__(new)
        new.layers, new.heads, new.hidden, new.eps, new.scaling, new.bias = (
            self.layers, self.heads, self.hidden, self.eps, self.scaling, self.bias)
        idx = torch.tensor(keep, device=next(iter(self.params.values())).device)
        new._register({n: p.detach().index_select(0, idx).clone() for n, p in self.params.items()},
                      {n: tuple(t[i] for i in keep) for n, t in self.trainable.items()})
        return new


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x [run, rows, in] @ w[run, out, in]ᵀ + b [run, out] -> [run, rows, out]."""
    if x.shape[0] == 1:  # one run: the plain fused product
        return F.linear(x[0], w[0], b[0]).unsqueeze(0)
    return torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm of x [run, rows, hidden] with each run's gain and bias [run, hidden]."""
    if x.shape[0] == 1:  # one run: LayerNorm with its affine in one kernel
        return F.layer_norm(x, x.shape[-1:], w[0], b[0], eps=eps)
    return F.layer_norm(x, x.shape[-1:], eps=eps) * w.unsqueeze(1) + b.unsqueeze(1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q kᵀ · scaling + bias) v for q, k, v `[batch, head, seq, d_head]` (no mask:
    every token attends to every token; `bias [query, key]`: model.attn_bias, or None).
    Eagerly, sdpa's kernel is the fastest CPU form at head dimension 8; under
    torch.compile the broadcast form below fuses into one loop and is faster still
    (docs/performance.md). Both compute the same attention."""
    if torch.compiler.is_compiling():
        scores = (q.unsqueeze(3) * k.unsqueeze(2)).sum(-1) * scaling   # [batch, head, query, key]
        if bias is not None:
            scores = scores + bias.to(scores.dtype)
        return (torch.softmax(scores, dim=-1).unsqueeze(-1) * v.unsqueeze(2)).sum(3)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=None if bias is None else bias.to(q.dtype),
                                          scale=scaling)


def forward(stack: Stack, tokens: torch.Tensor, runs: list[int] | None = None) -> torch.Tensor:
    """`tokens [run, batch, seq]` -> predictions `[run, batch, seq]`, what each run's
    `MatrixBert.forward` returns. `runs`: only these runs of the stack (tokens then hold
    one row per listed run), e.g. to evaluate the runs that are due."""
    P = stack.params if runs is None else {n: p[runs] for n, p in stack.params.items()}
    R, B, S = tokens.shape
    H, heads, eps = stack.hidden, stack.heads, stack.eps
    d = H // heads
    e = "bert.embeddings."
    word = P[WORD]                                                    # [run, vocab, hidden]
    offsets = torch.arange(R, device=tokens.device).view(R, 1, 1) * word.shape[1]
    x = F.embedding(tokens + offsets, word.reshape(-1, H))            # [run, batch, seq, hidden]
    x = x + P[e + "position_embeddings.weight"][:, None, :S]
    x = _layer_norm(x.reshape(R, B * S, H), P[e + "LayerNorm.weight"], P[e + "LayerNorm.bias"], eps)
    for i in range(stack.layers):
        a = f"bert.encoder.layer.{i}."
        qkv = _linear(x, P[a + "attention.self.qkv.weight"], P[a + "attention.self.qkv.bias"])
        q, k, v = qkv.view(R * B, S, 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)  # each [run*batch, head, seq, d]
        z = attention(q, k, v, stack.scaling, stack.bias).transpose(1, 2).reshape(R, B * S, H)
        h = _linear(z, P[a + "attention.output.dense.weight"], P[a + "attention.output.dense.bias"])
        x = _layer_norm(h + x, P[a + "attention.output.LayerNorm.weight"], P[a + "attention.output.LayerNorm.bias"], eps)
        h = F.gelu(_linear(x, P[a + "intermediate.dense.weight"], P[a + "intermediate.dense.bias"]))
        h = _linear(h, P[a + "output.dense.weight"], P[a + "output.dense.bias"])
        x = _layer_norm(h + x, P[a + "output.LayerNorm.weight"], P[a + "output.LayerNorm.bias"], eps)
    return _linear(x, P["readout.weight"], P["readout.bias"]).view(R, B, S)


class StackedAdam:
    """Adam for a `Stack`, run by run: each run keeps its own step count and lrs, so
    runs resumed from different steps train in one stack. The arithmetic is PyTorch's
    own (`torch.optim.adam.adam` on the run's slices), and the state converts to and from
    the `state_dict` of `mclib.core.train.make_optimizer` for that run's HF model, so a
    checkpoint resumes on either path.

    groups(r): the run's param groups as (names, lr at this step), from `param_groups`.
    """

    def __init__(self, stack: Stack, betas: tuple[float, float], foreach: bool | None = None):
        self.stack, self.betas, self.foreach = stack, betas, foreach
        self.exp_avg = {n: torch.zeros_like(p) for n, p in stack.params.items() if p.requires_grad}
        self.exp_avg_sq = {n: torch.zeros_like(p) for n, p in stack.params.items() if p.requires_grad}
        # [run] lists of {name: step tensor}, one 0-d float tensor per parameter as torch's Adam keeps
        self.steps = [{n: torch.tensor(0.0) for n in self.exp_avg if stack.trainable[n][r]}
                      for r in range(stack.runs)]

    @torch.no_grad()
    def step(self, r: int, groups: list[tuple[list[str], float]]) -> None:
        P, G = self.stack.params, {n: p.grad for n, p in self.stack.params.items() if p.requires_grad}
        for names, lr in groups:
            names = [n for n in names if n in self.steps[r]]
            if not names:
                continue
            adam_update(
                [P[n][r] for n in names], [G[n][r] for n in names],
                [self.exp_avg[n][r] for n in names], [self.exp_avg_sq[n][r] for n in names], [],
                [self.steps[r][n] for n in names], foreach=self.foreach,
                amsgrad=False, beta1=self.betas[0], beta2=self.betas[1], lr=lr, weight_decay=0.0,
                eps=1e-8, maximize=False)

    def select(self, stack: Stack, keep: list[int]) -> "StackedAdam":
        new = StackedAdam.__new__(StackedAdam)
        new.stack, new.betas, new.foreach = stack, self.betas, self.foreach
        new.exp_avg = {n: t[keep].clone() for n, t in self.exp_avg.items()}
        new.exp_avg_sq = {n: t[keep].clone() for n, t in self.exp_avg_sq.items()}
        new.steps = [self.steps[r] for r in keep]
        return new

    def export(self, r: int, model: MatrixBert, reference_opt: torch.optim.Optimizer) -> dict:
        """Run r's state as the `state_dict` of `reference_opt` (made by `make_optimizer`
        for `model`, the run's HF model)."""
        by_param = {p: n for n, p in model.named_parameters()}
        for group in reference_opt.param_groups:
            for p in group["params"]:
                name, rows = hf_slices(by_param[p], self.stack.hidden)
                if name in self.steps[r]:
                    reference_opt.state[p] = {"step": self.steps[r][name].clone(),
                                              "exp_avg": self.exp_avg[name][r][rows].clone(),
                                              "exp_avg_sq": self.exp_avg_sq[name][r][rows].clone()}
        return reference_opt.state_dict()

    @torch.no_grad()
    def load(self, r: int, model: MatrixBert, reference_opt: torch.optim.Optimizer) -> None:
        """Run r's state from `reference_opt`, an optimizer of `make_optimizer` with a saved state loaded."""
        by_param = {p: n for n, p in model.named_parameters()}
        for group in reference_opt.param_groups:
            for p in group["params"]:
                state = reference_opt.state.get(p)
                name, rows = hf_slices(by_param[p], self.stack.hidden)
                if not state or name not in self.steps[r]:
                    continue
                self.exp_avg[name][r][rows] = state["exp_avg"]
                self.exp_avg_sq[name][r][rows] = state["exp_avg_sq"]
                self.steps[r][name] = state["step"].clone().float().cpu()
