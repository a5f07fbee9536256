"""Looking inside attention: capture, ablate and patch heads (E3-E5, E8, E9, E10).

The model's attention runs through mclib's own attention function (`mclib.core.attention`,
the implementation "mclib"), which offers hook points between softmax(q kᵀ) and its product
with v, and after it. `AttentionHooks` is what sits at those points: it is attached (and
the model switched to "mclib") only inside a `with` block; on exit the previous
implementation ("sdpa" or "eager") comes back, also after an exception.

    with AttentionHooks(model) as hooks:
        hooks.capture()                                # keep probs and z of every layer
        hooks.ablate({(3, 1)}, mode="uniform")         # (layer, head), 0-indexed
        pred = model(tokens)
    hooks.probs[3]                                     # [batch, head, query, key]

Layers and heads are 0-indexed in code; `paper_heads` converts the paper's 1-indexed
(layer, head) pairs.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from numbers import Integral

import torch

from ..core.attention import IMPL  # importing it registers mclib's attention function

ABLATION_MODES = ("uniform", "batch_mean")


def paper_heads(pairs: Iterable[tuple[int, int]]) -> set[tuple[int, int]]:
    """The paper's 1-indexed (layer, head) pairs -> 0-indexed pairs for `AttentionHooks.ablate`."""
    out = set()
    for pair in pairs:
        layer, head = _as_pair(pair)
        if layer < 1 or head < 1:
            raise ValueError(f"paper head {pair!r} is not 1-indexed (layers and heads start at 1 in the paper)")
        out.add((layer - 1, head - 1))
    return out


def _as_pair(pair) -> tuple[int, int]:
    if not (isinstance(pair, Sequence) and len(pair) == 2 and all(isinstance(i, Integral) for i in pair)):
        raise ValueError(f"head {pair!r} is not a (layer, head) pair of integers")
    return int(pair[0]), int(pair[1])


class AttentionHooks:
    """Switch `model` (a MatrixBert) to the "mclib" attention for the length of a `with` block.

    Nothing is switched on at first: the model computes exactly its eager attention.
    `capture`, `ablate` and `patch` switch things on; `reset` switches everything off.
    After every forward pass with capture on, `probs[layer]` is `[batch, head, query, key]`
    and `z[layer]` is `[batch, head, query, d_head]` (softmax·V, before the output
    projection), detached. Each pass fills new dicts: `z = hooks.z` keeps one pass.
    """

    def __init__(self, model):
        self.model = model
        self.modules = [layer.attention.self for layer in model.bert.encoder.layer]
        self.n_layers = len(self.modules)
        self.n_heads = model.config.num_attention_heads
        self.probs: dict[int, torch.Tensor] = {}
        self.z: dict[int, torch.Tensor] = {}
        self._previous: str | None = None
        self.reset()

    # --- the context ---------------------------------------------------------------
    def __enter__(self) -> "AttentionHooks":
        if any(getattr(m, "mclib_hooks", None) is not None for m in self.modules):
            raise ValueError("the model is already inside an AttentionHooks block; nesting is not supported")
        self._previous = self.model.config._attn_implementation
        try:
            self.model.set_attn_implementation(IMPL)
            # set_attn_implementation only warns when it cannot switch; fail loudly instead.
            if any(m.config._attn_implementation != IMPL for m in self.modules):
                raise RuntimeError(f"could not switch {type(self.model).__name__} to the {IMPL!r} attention")
            for m in self.modules:
                m.mclib_hooks = self
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for m in self.modules:
            m.__dict__.pop("mclib_hooks", None)
        if self._previous is not None:
            self.model.set_attn_implementation(self._previous)
            self._previous = None

    # --- what to do ------------------------------------------------------------------
    def reset(self) -> "AttentionHooks":
        """Switch off capture, ablation and patching (captured tensors are kept)."""
        self._capturing = False
        self._ablated: dict[int, list[int]] = {}   # layer -> heads
        self._mode = "uniform"
        self._patches: dict[int, torch.Tensor] = {}
        return self

    def capture(self, on: bool = True) -> "AttentionHooks":
        """Keep every layer's probs and z at each forward pass (the last pass wins)."""
        self._capturing = on
        if on:
            self.probs, self.z = {}, {}
        return self

    def ablate(self, heads: Iterable[tuple[int, int]], mode: str = "uniform") -> "AttentionHooks":
        """Replace the probabilities of the given 0-indexed (layer, head) pairs (replaces any earlier set).

        mode "uniform": every probability 1/seq_len (the paper's text);
        "batch_mean": a head's probabilities replaced by their mean over the batch of the
        same forward pass (the authors' released code).
        """
        if mode not in ABLATION_MODES:
            raise ValueError(f"ablation mode {mode!r} is not one of {', '.join(ABLATION_MODES)}")
        ablated: dict[int, list[int]] = {}
        for pair in heads:
            layer, head = _as_pair(pair)
            self._check_layer(layer)
            if not 0 <= head < self.n_heads:
                raise ValueError(f"head {head} is out of range: the model has {self.n_heads} heads (0-indexed)")
            ablated.setdefault(layer, []).append(head)
        self._ablated, self._mode = ablated, mode
        return self

    def patch(self, z: dict[int, torch.Tensor] | Sequence[torch.Tensor],
              layers: Iterable[int] | None = None) -> "AttentionHooks":
        """Write stored per-head outputs `z[layer]` `[batch, head, query, d_head]` into the
        given layers (None: every layer, the paper's text; [last]: the authors' code).
        Patching replaces z after any ablation of the same layer."""
        z = dict(enumerate(z)) if isinstance(z, Sequence) else dict(z)
        layers = range(self.n_layers) if layers is None else list(layers)
        patches = {}
        for layer in layers:
            self._check_layer(layer)
            layer = int(layer)
            if layer not in z:
                raise ValueError(f"no stored outputs for layer {layer} (stored: {sorted(z)})")
            if z[layer].ndim != 4 or z[layer].shape[1] != self.n_heads:
                raise ValueError(f"stored outputs for layer {layer} have shape {tuple(z[layer].shape)}, "
                                 f"expected [batch, {self.n_heads} heads, query, d_head]")
            patches[layer] = z[layer].detach()
        self._patches = patches
        return self

    def _check_layer(self, layer) -> None:
        if not (isinstance(layer, Integral) and 0 <= layer < self.n_layers):
            raise ValueError(f"layer {layer!r} does not exist: the model has {self.n_layers} layers (0-indexed)")

    # --- called from mclib.core.attention.mclib_attention, the hook points -----------------
    def _ablate(self, layer: int, probs: torch.Tensor) -> torch.Tensor:
        heads = self._ablated.get(layer)
        if not heads:
            return probs
        if self._mode == "uniform":
            replacement = torch.full_like(probs, 1.0 / probs.shape[-1])
        else:  # batch_mean: the pattern the head shows on average, the same for every input
            replacement = probs.mean(0, keepdim=True).expand_as(probs)
        which = torch.zeros(probs.shape[1], dtype=torch.bool, device=probs.device)
        which[heads] = True
        return torch.where(which[None, :, None, None], replacement, probs)  # out of place: keeps autograd sane

    def _patch(self, layer: int, z: torch.Tensor) -> torch.Tensor:
        stored = self._patches.get(layer)
        if stored is None:
            return z
        if stored.shape != z.shape:
            raise ValueError(f"stored outputs for layer {layer} have shape {tuple(stored.shape)}, "
                             f"but this input gives {tuple(z.shape)}")
        return stored.to(dtype=z.dtype, device=z.device)

    def _capture(self, layer: int, probs: torch.Tensor, z: torch.Tensor) -> None:
        if self._capturing:
            if layer == 0:  # a new forward pass: new dicts, so references to the last pass stay valid
                self.probs, self.z = {}, {}
            self.probs[layer] = probs.detach()
            self.z[layer] = z.detach()
