"""Where a run trains and in what precision: the device (`resolve_device`, `with_device`), the
process-wide precision switches (`check_precision`, `set_precision`) and what wraps a forward
pass (`autocast`, `emulated_tf32`).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import torch

from .config import PRECISIONS, ConfigError, Profile
from .tf32 import EmulateTF32

log = logging.getLogger(__name__)


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device = 'cuda' but no CUDA device is available")
    return torch.device(name)


def with_device(profile: Profile) -> Profile:
    """`profile` with `train.device: auto` resolved in this process (the one that starts or submits
    runs), so workers train where it chose and profile.yaml records it."""
    if profile.train.device != "auto":
        return profile
    return profile.replace(**{"train.device": resolve_device("auto").type})


def cpu_has_bf16() -> bool:
    """Whether this CPU has native bf16 (AVX512-BF16 or AMX); without, torch emulates it, slowly."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def check_precision(device: torch.device, precision: str) -> None:
    """Say in one line on stderr when a precision runs emulated (tf32 off CUDA, `mclib.core.tf32`;
    bf16 on a CPU without bf16 units); an unknown precision is a `ConfigError`."""
    if precision not in PRECISIONS:
        raise ConfigError(f"train.precision = {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "tf32" and device.type != "cuda":
        log.warning(
            f"mclib: train.precision = 'tf32' on {device.type}: TF32 products emulated (mclib.core.tf32), "
            "eagerly and slower than fp32"
        )
    if precision == "bf16" and device.type == "cpu" and not cpu_has_bf16():
        log.warning(
            "mclib: train.precision = 'bf16' on a CPU without bf16 units (no avx512_bf16 or amx_bf16): "
            "torch emulates it, slower than fp32"
        )


def set_precision(device: torch.device, precision: str) -> None:
    """Set this process's matmul precision: on CUDA, TF32 tensor cores on for "tf32" only (bf16's
    products come from `autocast`). With TF32 off, sdpa's memory-efficient kernel still uses
    3xTF32 products on sm80+ (near fp32). Nothing to set on the CPU."""
    check_precision(device, precision)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"


def autocast(device: torch.device, precision: str):
    """bf16 autocast (fp32 master weights) or nothing. Autocast's weight cache is off: a copy
    cached during a CUDA graph capture would never be refreshed by the replays."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {PRECISIONS}")
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)
    return contextlib.nullcontext()


def emulated_tf32(device: torch.device, precision: str):
    """`mclib.core.tf32.EmulateTF32` for tf32 off CUDA, else nothing: wraps a forward and its backward."""
    if precision == "tf32" and device.type != "cuda":
        return EmulateTF32()
    return contextlib.nullcontext()
