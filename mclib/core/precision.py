"""Where a run trains and in what precision: the device (`resolve_device`, recorded in the
profile by `with_device`), the precision's process-wide switches (`check_precision`,
`set_precision`) and what goes around a forward pass (`autocast`, `emulated_tf32`). The step
(`mclib.core.step`) and the loop (`mclib.core.train`) use them; so do the analyses that run a
model as training does."""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import torch

from .config import PRECISIONS, ConfigError, Profile

log = logging.getLogger(__name__)


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device = 'cuda' but no CUDA device is available")
    return torch.device(name)


def with_device(profile: Profile) -> Profile:
    """`profile` with `train.device: auto` resolved here (cuda if this process sees one,
    else cpu): resolved once, by the process that starts or submits runs, so a worker
    trains on the device the submitter chose, and the run's profile.yaml records it."""
    if profile.train.device != "auto":
        return profile
    return profile.replace(**{"train.device": resolve_device("auto").type})


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX); without, torch
    emulates bf16 (it runs, slower than fp32)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def check_precision(device: torch.device, precision: str) -> None:
    """A precision the device does not have runs emulated, said in one line on stderr: tf32
    off CUDA (`mclib.core.tf32`: the GPU's TF32 products, for studies of what TF32 changes),
    bf16 on a CPU without bf16 units. A precision that does not exist is a `ConfigError`."""
    if precision not in PRECISIONS:
        raise ConfigError(f"train.precision = {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "tf32" and device.type != "cuda":
        log.warning(f"mclib: train.precision = 'tf32' on {device.type}: TF32 products emulated (mclib.core.tf32), "
                    "eagerly and slower than fp32")
    if precision == "bf16" and device.type == "cpu" and not cpu_has_bf16():
        log.warning("mclib: train.precision = 'bf16' on a CPU without bf16 units (no avx512_bf16 or amx_bf16): "
                    "torch emulates it, slower than fp32")


def set_precision(device: torch.device, precision: str) -> None:
    """What `train.precision` means for the matmuls of this process: on CUDA, "tf32" runs
    fp32 matmuls on the TF32 tensor cores (fp32 storage and accumulation, 10-bit-mantissa
    products) and "fp32" and "bf16" do not (bf16's own products are bf16 through
    `autocast`; its fp32 remainder stays fp32). With TF32 off, cuBLAS's matmuls are IEEE
    fp32, but on compute capability 8.0 or newer the `sdpa` attention's memory-efficient kernel
    multiplies with CUTLASS's 3xTF32 products (near fp32, not IEEE) whatever `allow_tf32` says.
    Nothing to set on the CPU, which has no TF32."""
    check_precision(device, precision)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"


def autocast(device: torch.device, precision: str):
    """bf16 autocast (fp32 master weights) or nothing (fp32, tf32: `set_precision`).
    Without autocast's cache of bf16 weight copies: a copy cached while a CUDA graph captures
    would be one the replays never refresh (`mclib.core.graphstep`), and each weight is cast
    once a forward anyway, so the cache saves nothing here (the products are the same bits)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {PRECISIONS}")
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)
    return contextlib.nullcontext()


def emulated_tf32(device: torch.device, precision: str):
    """Around a forward and its backward: tf32 off CUDA rounds the inputs of the GPU's
    TF32 products (`mclib.core.tf32.EmulateTF32`); anything else, nothing."""
    if precision == "tf32" and device.type != "cuda":
        from .tf32 import EmulateTF32
        return EmulateTF32()
    return contextlib.nullcontext()
