"""TF32 on the CPU: the products an NVIDIA GPU computes with `allow_tf32`, emulated.

With `torch.backends.cuda.matmul.allow_tf32 = True` (the paper setting's `train.precision:
tf32`), cuBLAS multiplies fp32 matrices on the tensor cores: each input is cut to TF32 (8
exponent bits, 10 mantissa bits, fp32's range) and the products are summed in fp32. The CPU
has no TF32, so `train.precision: tf32` there runs `EmulateTF32`: every matrix product that
cuBLAS computes on the GPU gets its two inputs rounded to 10 mantissa bits, and is then
computed in fp32 as usual, in the forward pass and in the backward pass.

Which products: those of the linear layers (`F.linear`: its forward product, and both
gradient products of its backward) and `torch.matmul` (an `attention: eager` model's
QKᵀ and PV, forward and backward). Not the attention of the `sdpa` model: in fp32 on a GPU
of compute capability 8.0 or newer, PyTorch's memory-efficient attention kernel (the only
fused one that takes fp32) multiplies with CUTLASS's `OpMultiplyAddFastF32`, three TF32
products per fp32 product (`mem_eff_attention/gemm_kernel_utils.h`,
`DefaultGemmType<ArchTag, float>`), which is about as exact as fp32 whatever `allow_tf32`
says; on the CPU the same `sdpa` call is one fused fp32 kernel that this mode leaves alone.

Rounding: to nearest, ties away from zero, as PTX's `cvt.rna.tf32.f32`. Which rounding
cuBLAS's own conversion uses is not documented; a tie is one input in 2^13, too rare to
move a training curve.

The mode is a `TorchFunctionMode` that replaces those two calls with autograd functions
(`_Linear`, `_Matmul`) whose backward rounds the incoming gradient and multiplies it with
the rounded saved inputs; every other call passes through. `torch.compile`d code does not
go through it, so an emulated run trains eagerly (mclib.core.step.step_variant).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

DROPPED_BITS = 13   # fp32 keeps 23 mantissa bits, TF32 10


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """`x` (fp32) with its mantissa rounded to TF32's 10 bits (to nearest, ties away from
    zero), a new contiguous fp32 tensor. In the bits: add half of the last kept place to the
    magnitude, then clear the 13 dropped bits; a carry moves into the exponent as it should.
    Infinities stay infinite and torch's NaN (0x7fc00000) stays NaN; a value within half a
    TF32 place of fp32's largest rounds to infinity, as a format without those values must."""
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
        g2 = g.reshape(-1, g.shape[-1])                        # [rows, out]
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
        batched = lambda t: t.reshape(-1, *t.shape[-2:])          # [batch, rows, cols]
        gr = batched(round_tf32(g))                               # [batch, m, n]
        da = torch.bmm(gr, batched(br).transpose(1, 2)).view(ar.shape) if ctx.needs_input_grad[0] else None
        db = torch.bmm(batched(ar).transpose(1, 2), gr).view(br.shape) if ctx.needs_input_grad[1] else None
        return da, db


LINEAR = {F.linear, torch._C._nn.linear}
MATMUL = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__}


class EmulateTF32(TorchFunctionMode):
    """Inside this mode, `F.linear` and `torch.matmul` on fp32 tensors multiply TF32-rounded
    inputs, forward and backward. `counts` tallies the calls it replaced ("linear",
    "matmul"), for the tests and for a reader who wants to see what it touched."""

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
            if (a.dtype == b.dtype == torch.float32 and a.dim() == b.dim() >= 2
                    and a.shape[:-2] == b.shape[:-2]):
                self.counts["matmul"] = self.counts.get("matmul", 0) + 1
                return _Matmul.apply(a, b)
            if a.dtype == torch.float32 and a.dim() >= 2 and b.dim() >= 2:
                raise NotImplementedError(f"EmulateTF32: torch.matmul of shapes {tuple(a.shape)} and "
                                          f"{tuple(b.shape)} (broadcast batch dimensions) is not emulated")
        return func(*args, **kwargs)
