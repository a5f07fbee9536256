import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mclib.config import load_profile, profile_path
from mclib.data import sample_batch
from mclib.flops import authors_step_flops, forward_flops, matmul_params, train_step_flops
from mclib.model import build_model


def test_flop_formula_matches_torch_flop_counter(smoke_profile):
    # eager attention: its matmuls are aten.bmm, which FlopCounterMode counts (the CPU sdpa kernel it does not)
    cfg = smoke_profile.replace(**{"model.attention": "eager"}).model
    model = build_model(cfg, 7, seed=0)
    batch = sample_batch(3, 7, 2, 0.3, torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        model(batch.tokens).sum().backward()
    assert counter.get_total_flops() == train_step_flops(cfg, 7, 3)


def test_paper_step_is_about_2_tflop():
    cfg = load_profile(profile_path("paper")).model
    assert matmul_params(cfg) == 4 * (4 * 768**2 + 2 * 768 * 3072) + 768
    assert train_step_flops(cfg, 7, 256) == pytest.approx(2.15e12, rel=0.01)
    assert authors_step_flops(cfg, 7, 256, 64) == train_step_flops(cfg, 7, 256) + forward_flops(cfg, 7, 320)
