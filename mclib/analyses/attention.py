"""Ablating and patching heads (E3-E5, E8) as hooks on the named hook points of
`mclib.core.hooks`: `blocks.{l}.attn.hook_pattern` `[batch, head, query, key]` and
`blocks.{l}.attn.hook_z` `[batch, head, query, d_head]`.

    from mclib.core.hooks import hooks, run_with_cache
    with hooks(model, ablation_hooks(model, {(3, 1)}, mode="uniform")):   # (layer, head), 0-indexed
        pred = model(tokens).logits
    _, cache = run_with_cache(model, clean_tokens, names=z_names(model))
    with hooks(model, patching_hooks(model, cache, layers=[3])):
        pred = model(corrupt_tokens).logits

Layers and heads are 0-indexed in code; `paper_heads` converts the paper's 1-indexed
(layer, head) pairs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from numbers import Integral

import torch

from ..core.hooks import Hook

ABLATION_MODES = ("uniform", "batch_mean")


def paper_heads(pairs: Iterable[tuple[int, int]]) -> set[tuple[int, int]]:
    """The paper's 1-indexed (layer, head) pairs -> 0-indexed pairs for `ablation_hooks`."""
    out = set()
    for pair in pairs:
        layer, head = _as_pair(pair)
        if layer < 1 or head < 1:
            raise ValueError(
                f"paper head {pair!r} is not 1-indexed (layers and heads start at 1 in the paper)"
            )
        out.add((layer - 1, head - 1))
    return out


def _as_pair(pair) -> tuple[int, int]:
    if not (isinstance(pair, Sequence) and len(pair) == 2 and all(isinstance(i, Integral) for i in pair)):
        raise ValueError(f"head {pair!r} is not a (layer, head) pair of integers")
    return int(pair[0]), int(pair[1])


def _check_layer(model, layer) -> int:
    n_layers = model.config.num_hidden_layers
    if not (isinstance(layer, Integral) and 0 <= layer < n_layers):
        raise ValueError(f"layer {layer!r} does not exist: the model has {n_layers} layers (0-indexed)")
    return int(layer)


def ablation_hooks(model, heads: Iterable[tuple[int, int]], mode: str = "uniform") -> list[Hook]:
    """Hooks that replace the attention probabilities of the given 0-indexed (layer, head)
    pairs, one per layer touched, on `blocks.{l}.attn.hook_pattern`.

    mode "uniform": every probability 1/seq_len (the paper's text);
    "batch_mean": a head's probabilities replaced by their mean over the batch of the
    same forward pass (the authors' released code).
    """
    if mode not in ABLATION_MODES:
        raise ValueError(f"ablation mode {mode!r} is not one of {', '.join(ABLATION_MODES)}")
    n_heads = model.config.num_attention_heads
    ablated: dict[int, list[int]] = {}
    for pair in heads:
        layer, head = _as_pair(pair)
        _check_layer(model, layer)
        if not 0 <= head < n_heads:
            raise ValueError(f"head {head} is out of range: the model has {n_heads} heads (0-indexed)")
        ablated.setdefault(layer, []).append(head)

    def ablate(probs: torch.Tensor, name: str, heads: list[int]) -> torch.Tensor:
        if mode == "uniform":
            replacement = torch.full_like(probs, 1.0 / probs.shape[-1])
        else:  # batch_mean: the pattern the head shows on average, the same for every input
            replacement = probs.mean(0, keepdim=True).expand_as(probs)
        which = torch.zeros(probs.shape[1], dtype=torch.bool, device=probs.device)
        which[heads] = True
        return torch.where(
            which[None, :, None, None], replacement, probs
        )  # out of place: keeps autograd sane

    return [
        (f"blocks.{layer}.attn.hook_pattern", lambda p, name, hs=hs: ablate(p, name, hs))
        for layer, hs in sorted(ablated.items())
    ]


def z_names(model) -> list[str]:
    """The per-head outputs of every layer, `blocks.{l}.attn.hook_z`: what `patching_hooks`
    reads from a cache."""
    return [f"blocks.{l}.attn.hook_z" for l in range(model.config.num_hidden_layers)]


def patching_hooks(
    model, cache: Mapping[str, torch.Tensor], layers: Iterable[int] | None = None
) -> list[Hook]:
    """Hooks that write stored per-head outputs (`cache["blocks.{l}.attn.hook_z"]`,
    `[batch, head, query, d_head]`, from `run_with_cache`) into the given layers (None:
    every layer, the paper's text; [last]: the authors' code). A patch replaces z after
    any ablation of the same layer's pattern."""
    n_heads = model.config.num_attention_heads
    layers = range(model.config.num_hidden_layers) if layers is None else list(layers)
    out = []
    for layer in layers:
        name = f"blocks.{_check_layer(model, layer)}.attn.hook_z"
        if name not in cache:
            raise ValueError(f"no stored outputs for layer {layer} ({name} is not in the cache)")
        stored = cache[name].detach()
        if stored.ndim != 4 or stored.shape[1] != n_heads:
            raise ValueError(
                f"stored outputs for layer {layer} have shape {tuple(stored.shape)}, "
                f"expected [batch, {n_heads} heads, query, d_head]"
            )

        def patch(z: torch.Tensor, name: str, stored=stored) -> torch.Tensor:
            if stored.shape != z.shape:
                raise ValueError(
                    f"stored outputs for {name} have shape {tuple(stored.shape)}, "
                    f"but this input gives {tuple(z.shape)}"
                )
            return stored.to(dtype=z.dtype, device=z.device)

        out.append((name, patch))
    return out
