"""Matrices, masks and tokens (docs/protocol.md, §1.1-1.2). A `Batch` holds X `[batch, n, n]`
(rounded to 2 decimals), its mask `[batch, n, n]` (True = masked) and the tokens
`[batch, n*n]` the model reads: X row by row, MASK_ID where masked. Every sampler takes an
explicit `torch.Generator` and samples on its device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MASK_ID = 0
VALUE_MIN, VALUE_MAX = -10.0, 10.0
# id(x) = 1001 + 100 x: -10.00 -> 1, 0.00 -> 1001, 10.00 -> 2001.
ZERO_ID = 1001
VOCAB_SIZE = 2002
DISTRIBUTIONS = ("uniform", "gaussian", "laplace", "random")


def round2(x: torch.Tensor) -> torch.Tensor:
    """Round to 2 decimals, the resolution of the vocabulary."""
    return torch.round(x * 100) / 100


def tokenize(values: torch.Tensor) -> torch.Tensor:
    """Token ids of values on the 0.01 grid in [-10, 10] (values are rounded first)."""
    values = round2(values)
    if values.numel() and (values.min() < VALUE_MIN or values.max() > VALUE_MAX):
        bad = values[(values < VALUE_MIN) | (values > VALUE_MAX)].flatten()[0].item()
        raise ValueError(f"value {bad:g} is outside the vocabulary range [{VALUE_MIN:g}, {VALUE_MAX:g}]")
    return (ZERO_ID + torch.round(values * 100)).long()


def detokenize(ids: torch.Tensor) -> torch.Tensor:
    """Values of token ids; MASK_ID maps to NaN (it has no value)."""
    if ids.numel() and (ids.min() < 0 or ids.max() >= VOCAB_SIZE):
        bad = ids[(ids < 0) | (ids >= VOCAB_SIZE)].flatten()[0].item()
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {VOCAB_SIZE - 1}]")
    values = (ids.double() - ZERO_ID) / 100
    return torch.where(ids == MASK_ID, torch.full_like(values, float("nan")), values).float()


def sample_matrices(
    batch: int, n: int, rank: int, gen: torch.Generator, dist: str = "uniform"
) -> torch.Tensor:
    """`[batch, n, n]` matrices X = U Vᵀ rounded to 2 decimals. dist: "uniform" U, V ~ Unif[-1, 1]
    (the paper); "gaussian" N(0, 0.5²) and "laplace" Laplace(0, 0.25) factors (E18); "random":
    full-rank iid Unif[-1, 1] entries (E2; `rank` ignored)."""
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"dist {dist!r} is not one of {DISTRIBUTIONS}")
    if not 1 <= rank <= n:
        raise ValueError(f"rank {rank} must be between 1 and n = {n}")
    dev = gen.device
    if dist == "random":
        return round2(torch.rand(batch, n, n, generator=gen, device=dev) * 2 - 1)
    shape = (2, batch, n, rank)
    if dist == "uniform":
        uv = torch.rand(shape, generator=gen, device=dev) * 2 - 1
    elif dist == "gaussian":
        uv = torch.randn(shape, generator=gen, device=dev) * 0.5
    else:  # laplace by inverse CDF, so that the generator drives it
        u = torch.rand(shape, generator=gen, device=dev) - 0.5
        uv = -0.25 * torch.sign(u) * torch.log1p(-2 * u.abs().clamp(max=0.5 - 1e-7))
    with torch.autocast(dev.type, enabled=False):  # an autocast around the caller must not round X in bf16
        x = uv[0] @ uv[1].transpose(1, 2)
    return round2(x.clamp(VALUE_MIN, VALUE_MAX))


def random_mask(batch: int, n: int, p_mask: float, gen: torch.Generator) -> torch.Tensor:
    """`[batch, n, n]` bool, each entry masked (True) independently with probability p_mask."""
    if not 0 <= p_mask < 1:
        raise ValueError(f"p_mask {p_mask} must be in [0, 1)")
    return torch.rand(batch, n, n, generator=gen, device=gen.device) < p_mask


def structured_mask(
    n: int = 7, rows: tuple[int, ...] | None = None, keep: tuple[tuple[int, int], ...] | None = None
) -> torch.Tensor:
    """`[n, n]` bool: `rows` fully masked except the `keep` entries (E10). Default: the paper's
    rows 3 and 6 except (3, 1) and (6, 5) at n = 7, the same shape at another n."""
    if rows is None:
        rows = (n // 2, n - 1)
    if keep is None:
        keep = ((n // 2, 1), (n - 1, n - 2))
    for r in rows:
        if not 0 <= r < n:
            raise ValueError(f"row {r} is out of range for n = {n}")
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[list(rows)] = True
    for r, c in keep:
        if not (0 <= r < n and 0 <= c < n):
            raise ValueError(f"kept entry {(r, c)} is out of range for n = {n}")
        mask[r, c] = False
    return mask


@dataclass
class Batch:
    x: torch.Tensor  # [batch, n, n] float, rounded target
    mask: torch.Tensor  # [batch, n, n] bool, True = masked
    tokens: torch.Tensor  # [batch, n*n] long, MASK_ID where masked

    @property
    def n(self) -> int:
        return self.x.shape[-1]

    def to(self, device, non_blocking: bool = False) -> Batch:
        """The batch on `device` (itself if it is there). non_blocking to CUDA: through pinned
        memory, so the copy does not wait for the device (no host sync in a training step)."""

        def move(t: torch.Tensor) -> torch.Tensor:
            if t.device == torch.device(device):
                return t
            if non_blocking and torch.device(device).type == "cuda":
                t = t.pin_memory()
            return t.to(device, non_blocking=non_blocking)

        return Batch(move(self.x), move(self.mask), move(self.tokens))


def make_batch(x: torch.Tensor, mask: torch.Tensor, fill_value: float | None = None) -> Batch:
    """Tokenise X with its mask. fill_value=None writes MASK_ID at masked entries;
    a number writes that value's token instead (the copy check E2)."""
    mask = mask.expand_as(x)
    tokens = tokenize(x)
    fill = MASK_ID if fill_value is None else int(tokenize(torch.tensor(fill_value)))
    tokens = torch.where(mask, torch.full_like(tokens, fill), tokens)
    return Batch(x, mask, tokens.flatten(1))


def sample_batch(
    batch: int, n: int, rank: int, p_mask: float, gen: torch.Generator, *, dist: str = "uniform"
) -> Batch:
    """One training batch: fresh matrices and fresh random masks."""
    x = sample_matrices(batch, n, rank, gen, dist)
    return make_batch(x, random_mask(batch, n, p_mask, gen))


FACTOR_VARIANCE = {"uniform": 1 / 3, "gaussian": 0.5**2, "laplace": 2 * 0.25**2}  # Var of one factor entry


def copy_level(rank: int, dist: str = "uniform") -> float:
    """E[X²] = rank · Var(u)² for X = U Vᵀ with `dist`'s factors: the L_mask of a model that outputs
    0 at masked entries (the copying plateau); rank/9 for uniform factors."""
    if dist not in FACTOR_VARIANCE:
        raise ValueError(f"dist {dist!r} is not one of {', '.join(FACTOR_VARIANCE)}")
    return rank * FACTOR_VARIANCE[dist] ** 2
