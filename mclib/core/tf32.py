"""TF32 emulated on the CPU: the products a GPU computes under `allow_tf32` (`train.precision: tf32`).

`EmulateTF32` rounds both inputs of every `F.linear` and `torch.matmul` on fp32 tensors to
TF32's 10 mantissa bits (`round_tf32`) and multiplies in fp32, in the forward and backward
passes (`_Linear`, `_Matmul`); every other call passes through. sdpa attention is left alone:
on an sm80+ GPU its fp32 kernel uses 3xTF32 products, about as exact as fp32, whatever
`allow_tf32` says. Rounding is to nearest, ties away from zero, as PTX's `cvt.rna.tf32.f32`.
torch.compile'd code bypasses the mode, so an emulated run trains eagerly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

DROPPED_BITS = 13  # fp32 keeps 23 mantissa bits, TF32 10


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """`x` (fp32) with its mantissa rounded to TF32's 10 bits, to nearest and ties away from zero,
    as a new contiguous fp32 tensor. Infinities and torch's NaN stay; values within half a TF32
    place of fp32's largest round to infinity. A non-fp32 `x` raises TypeError."""
    if x.dtype != torch.float32:
        raise TypeError(f"round_tf32 takes fp32 tensors, not {x.dtype}")
    bits = x.contiguous().view(torch.int32) + (1 << (DROPPED_BITS - 1))  # two kernels: this add
    return bits.bitwise_and_(~((1 << DROPPED_BITS) - 1)).view(torch.float32)  # and this mask, in place


class _Linear(torch.autograd.Function):
    """`F.linear` with TF32 products: y = x̃ W̃ᵀ + b; dx = g̃ W̃, dW = g̃ᵀ x̃, db = Σ g
    (~: rounded to TF32; the bias and its gradient are sums, not products, and stay fp32)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        xr, wr = round_tf32(x), round_tf32(weight)
        ctx.save_for_backward(xr, wr)
        ctx.has_bias = bias is not None
        return F.linear(xr, wr, bias)

    @staticmethod
    def backward(ctx, g):
        xr, wr = ctx.saved_tensors
        g2 = g.reshape(-1, g.shape[-1])  # [rows, out]
        gr = round_tf32(g2)
        dx = torch.mm(gr, wr).view(xr.shape) if ctx.needs_input_grad[0] else None
        dw = torch.mm(gr.t(), xr.reshape(-1, xr.shape[-1])) if ctx.needs_input_grad[1] else None
        db = g2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db


class _Matmul(torch.autograd.Function):
    """`torch.matmul` of two matrices, or two tensors with the same batch dimensions
    (`[..., m, k] @ [..., k, n]`), TF32 products in both passes."""

    @staticmethod
    def forward(ctx, a, b):
        ar, br = round_tf32(a), round_tf32(b)
        ctx.save_for_backward(ar, br)
        return torch.matmul(ar, br)

    @staticmethod
    def backward(ctx, g):
        ar, br = ctx.saved_tensors
        batched = lambda t: t.reshape(-1, *t.shape[-2:])  # [batch, rows, cols]
        gr = batched(round_tf32(g))  # [batch, m, n]
        da = torch.bmm(gr, batched(br).transpose(1, 2)).view(ar.shape) if ctx.needs_input_grad[0] else None
        db = torch.bmm(batched(ar).transpose(1, 2), gr).view(br.shape) if ctx.needs_input_grad[1] else None
        return da, db


LINEAR = {F.linear, torch._C._nn.linear}
MATMUL = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__}


class EmulateTF32(TorchFunctionMode):
    """Inside this mode, `F.linear` and `torch.matmul` on fp32 tensors multiply TF32-rounded inputs,
    forward and backward; `counts` tallies the calls replaced ("linear", "matmul")."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in LINEAR:
            x, weight = args[0], kwargs.get("weight", args[1] if len(args) > 1 else None)
            bias = kwargs.get("bias", args[2] if len(args) > 2 else None)
            if x.dtype == weight.dtype == torch.float32:
                self.counts["linear"] = self.counts.get("linear", 0) + 1
                return _Linear.apply(x, weight, bias)
        elif func in MATMUL and not kwargs:
            a, b = args
            if (
                a.dtype == b.dtype == torch.float32
                and a.dim() == b.dim() >= 2
                and a.shape[:-2] == b.shape[:-2]
            ):
                self.counts["matmul"] = self.counts.get("matmul", 0) + 1
                return _Matmul.apply(a, b)
            if a.dtype == torch.float32 and a.dim() >= 2 and b.dim() >= 2:
                raise NotImplementedError(
                    f"EmulateTF32: torch.matmul of shapes {tuple(a.shape)} and "
                    f"{tuple(b.shape)} (broadcast batch dimensions) is not emulated"
                )
        return func(*args, **kwargs)
