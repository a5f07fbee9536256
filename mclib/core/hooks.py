"""Named hook points on every activation of `MatrixBert`, in TransformerLens' naming.

    with hooks(model, [("blocks.2.hook_mlp_out", lambda t, name: torch.zeros_like(t))]):
        pred = model(tokens).logits               # layer 2's MLP zeroed (layers from 0)
    pred, cache = run_with_cache(model, tokens, names=["blocks.0.attn.hook_pattern"])  # pred: the logits
    cache["blocks.0.attn.hook_pattern"]           # [batch, head, query, key]

A hook is a pair (name, fn); `fn(tensor, name)` may return a replacement of the same shape
(None keeps it). Hooks are torch module hooks on HF's sub-modules, and for the pattern and z
the hook points of `mclib.core.attention`. `hooks` and `run_with_cache` are `with`-scoped:
nothing stays attached after them, also after an error. Several hooks on one name run in the
given order; blocks may nest.

BERT is post-LayerNorm; as in TransformerLens' `HookedEncoder`, `resid_mid` and `resid_post`
are the sums before the LayerNorm, `normalized_resid_*` its output. pos = n², l = 0 .. layers-1:

    hook_embed                          [batch, pos, d_model]  token embeddings (word_embeddings)
    hook_pos_embed                      [1, pos, d_model]      position embeddings (one row per position,
                                                               shared by the batch)
    blocks.{l}.hook_resid_pre           [batch, pos, d_model]  the block's input (l = 0: the embeddings'
                                                               LayerNorm output)
    blocks.{l}.attn.hook_q / _k / _v    [batch, pos, head, d_head]  the query / key / value projections
    blocks.{l}.attn.hook_pattern        [batch, head, query, key]   softmax(q kᵀ · scale)  (*)
    blocks.{l}.attn.hook_z              [batch, head, query, d_head] pattern @ v, before the output
                                                                      projection  (*)
    blocks.{l}.hook_attn_out            [batch, pos, d_model]  the attention output projection of z (no
                                                               residual, no LayerNorm)
    blocks.{l}.hook_resid_mid           [batch, pos, d_model]  resid_pre + attn_out: the input of the block's
                                                               first LayerNorm
    blocks.{l}.hook_normalized_resid_mid [batch, pos, d_model] that LayerNorm's output: the MLP's input and
                                                               its residual
    blocks.{l}.mlp.hook_pre             [batch, pos, d_mlp]    the MLP's first projection, before the GELU
    blocks.{l}.mlp.hook_post            [batch, pos, d_mlp]    after the GELU
    blocks.{l}.hook_mlp_out             [batch, pos, d_model]  the MLP's second projection (no residual, no
                                                               LayerNorm)
    blocks.{l}.hook_resid_post          [batch, pos, d_model]  normalized_resid_mid + mlp_out: the input of
                                                               the second LayerNorm
    blocks.{l}.hook_normalized_resid_post [batch, pos, d_model] that LayerNorm's output: the block's output
    hook_readout                        [batch, pos]           the read-out's output: the predictions, the
                                                               `logits` the model returns

(*) z is head-first, as the attention function returns it. A hook on a pattern or z switches
the model to mclib's attention function for the block; other hooks keep "sdpa" or "eager".
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Callable, Iterable

import torch

from .attention import IMPL  # importing it registers mclib's attention function

Hook = tuple[str, Callable]  # (name, fn(tensor, name) -> replacement or None)


def _heads(n_heads: int):
    """[batch, pos, d_model] <-> [batch, pos, head, d_head] (the q, k, v projections)."""
    return (lambda out: out.view(*out.shape[:-1], n_heads, -1), lambda new, out: new.reshape(out.shape))


_SAME = (lambda out: out, lambda new, out: new)
_SQUEEZE = (lambda out: out.squeeze(-1), lambda new, out: new.unsqueeze(-1))


def _points(model) -> dict[str, tuple]:
    """name -> (module, kind, view, unview). kind "out": a forward hook on the module's
    output; "in": a forward pre-hook on its first input; "attn": mclib's attention function."""
    if not hasattr(model, "bert"):
        raise ValueError(f"hook points exist on MatrixBert only, not on {type(model).__name__}")
    emb = model.bert.embeddings
    points = {
        "hook_embed": (emb.word_embeddings, "out", *_SAME),
        "hook_pos_embed": (emb.position_embeddings, "out", *_SAME),
    }
    heads = _heads(model.config.num_attention_heads)
    for l, layer in enumerate(model.bert.encoder.layer):
        b, attn = f"blocks.{l}.", layer.attention
        points.update(
            {
                b + "hook_resid_pre": (attn, "in", *_SAME),  # the attention reads it and adds it back
                b + "attn.hook_q": (attn.self.query, "out", *heads),
                b + "attn.hook_k": (attn.self.key, "out", *heads),
                b + "attn.hook_v": (attn.self.value, "out", *heads),
                b + "attn.hook_pattern": (attn.self, "attn", *_SAME),
                b + "attn.hook_z": (attn.self, "attn", *_SAME),
                b + "hook_attn_out": (attn.output.dense, "out", *_SAME),
                b + "hook_resid_mid": (attn.output.LayerNorm, "in", *_SAME),
                b + "hook_normalized_resid_mid": (attn.output.LayerNorm, "out", *_SAME),
                b + "mlp.hook_pre": (layer.intermediate.dense, "out", *_SAME),
                b + "mlp.hook_post": (layer.intermediate, "out", *_SAME),
                b + "hook_mlp_out": (layer.output.dense, "out", *_SAME),
                b + "hook_resid_post": (layer.output.LayerNorm, "in", *_SAME),
                b + "hook_normalized_resid_post": (layer.output.LayerNorm, "out", *_SAME),
            }
        )
    points["hook_readout"] = (model.readout, "out", *_SQUEEZE)
    return points


def hook_names(model) -> list[str]:
    """Every hook point of `model`, in the order of the forward pass."""
    return list(_points(model))


def check_names(model, names: Iterable[str]) -> list[str]:
    """The names as a list; a ValueError naming the first that is no hook point (and the nearest that is)."""
    points = _points(model)
    names = list(names)
    for name in names:
        if name not in points:
            near = difflib.get_close_matches(str(name), points, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else " (see mclib.core.hooks.hook_names)"
            raise ValueError(f"no hook point {name!r} on this model{hint}")
    return names


def _call(fn, name: str, tensor: torch.Tensor) -> torch.Tensor | None:
    new = fn(tensor, name)
    if new is not None and new.shape != tensor.shape:
        raise ValueError(
            f"the hook on {name} returned shape {tuple(new.shape)}, expected {tuple(tensor.shape)}"
        )
    return new


def _register(point: tuple, name: str, fn):
    """A torch hook on `point` = (module, kind, view, unview) of `_points` that runs fn."""
    module, kind, view, unview = point
    if kind == "out":

        def on_output(mod, args, out):
            new = _call(fn, name, view(out))
            return None if new is None else unview(new, out)

        return module.register_forward_hook(on_output)

    def on_input(mod, args, kwargs):  # the first input, passed by position or as hidden_states
        x = args[0] if args else kwargs["hidden_states"]
        new = _call(fn, name, x)
        if new is None:
            return None
        return ((new, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": new})

    return module.register_forward_pre_hook(on_input, with_kwargs=True)


class _AttentionPoints:
    """What mclib's attention function calls (`mclib_hooks` on every self-attention module):
    the pattern and z hooks of every block open on the model, in order."""

    def __init__(self, model, previous: str):
        self.model, self.previous = model, previous
        self.fns: list[tuple[str, Callable]] = []

    def pattern(self, layer: int, probs: torch.Tensor) -> torch.Tensor:
        return self._run(f"blocks.{layer}.attn.hook_pattern", probs)

    def z(self, layer: int, z: torch.Tensor) -> torch.Tensor:
        return self._run(f"blocks.{layer}.attn.hook_z", z)

    def _run(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        for hook_name, fn in self.fns:
            if hook_name == name:
                new = _call(fn, name, tensor)
                tensor = tensor if new is None else new
        return tensor


def _self_attentions(model):
    return [layer.attention.self for layer in model.bert.encoder.layer]


def _open_attention(model) -> _AttentionPoints:
    modules = _self_attentions(model)
    points = getattr(modules[0], "mclib_hooks", None)
    if points is not None:
        return points  # an enclosing block switched the model already
    points = _AttentionPoints(model, model.config._attn_implementation)
    model.set_attn_implementation(IMPL)
    # set_attn_implementation only warns when it cannot switch; fail loudly instead.
    if any(m.config._attn_implementation != IMPL for m in modules):
        model.set_attn_implementation(points.previous)
        raise RuntimeError(f"could not switch {type(model).__name__} to the {IMPL!r} attention")
    for m in modules:
        m.mclib_hooks = points
    return points


def _close_attention(model, points: _AttentionPoints) -> None:
    if points.fns:
        return  # an enclosing block still has hooks there
    for m in _self_attentions(model):
        m.__dict__.pop("mclib_hooks", None)
    model.set_attn_implementation(points.previous)


@contextlib.contextmanager
def hooks(model, fwd_hooks: Iterable[Hook]):
    """Inside the block, every forward pass of `model` runs the hooks (name, fn);
    fn(tensor, name) may return a replacement of the same shape. Nothing stays after it."""
    fwd_hooks = list(fwd_hooks)
    check_names(model, [name for name, _ in fwd_hooks])
    points = _points(model)
    handles, attention, mine = [], None, []
    try:
        for name, fn in fwd_hooks:
            if points[name][1] == "attn":
                attention = attention or _open_attention(model)
                mine.append((name, fn))
                attention.fns.append(mine[-1])
            else:
                handles.append(_register(points[name], name, fn))
        yield
    finally:
        for handle in handles:
            handle.remove()
        if attention is not None:
            for entry in mine:
                attention.fns.remove(entry)
            _close_attention(model, attention)


def run_with_hooks(model, tokens: torch.Tensor, fwd_hooks: Iterable[Hook]) -> torch.Tensor:
    """`model(tokens).logits` (the predictions `[batch, pos]`) with the hooks on for that one pass."""
    with hooks(model, fwd_hooks):
        return model(tokens).logits


def run_with_cache(
    model, tokens: torch.Tensor, names: Iterable[str] | None = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`(model(tokens).logits, cache)`, as TransformerLens' (the predictions `[batch, pos]`):
    cache maps each hook name (all, or those in `names`) to its activation in that pass,
    detached, as a hook there would see it (after the hooks of any enclosing `hooks` block on
    the same name)."""
    names = hook_names(model) if names is None else check_names(model, names)
    cache: dict[str, torch.Tensor] = {}

    def keep(tensor, name):
        cache[name] = tensor.detach()

    with hooks(model, [(name, keep) for name in names]):
        out = model(tokens).logits
    return out, cache
