import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mclib.core import paper
from mclib.core.config import load_profile, profile_path
from mclib.core.data import sample_batch
from mclib.core.flops import authors_step_flops, matmul_params, train_step_flops
from mclib.core.model import MatrixBert, bert_config, build_model


def test_flop_formula_matches_torch_flop_counter(smoke_profile):
    # eager attention: its matmuls are aten.bmm, which
    # FlopCounterMode counts (the CPU sdpa kernel it does not)
    cfg = smoke_profile.replace(**{"model.attention": "eager"}).model
    model = build_model(cfg, 7, seed=0)
    batch = sample_batch(3, 7, 2, 0.3, torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        model(batch.tokens).logits.sum().backward()
    assert counter.get_total_flops() == train_step_flops(cfg, 7, 3)


@pytest.mark.parametrize("name", ["smoke", "paper"])
def test_matmul_params_counts_the_model_s_weight_matrices(name):
    # counted on the model itself (on the meta device: no memory): every 2-D encoder weight and the read-out
    cfg = load_profile(profile_path(name)).model
    with torch.device("meta"):
        model = MatrixBert(bert_config(cfg, 7))
    counted = sum(
        p.numel()
        for n, p in model.named_parameters()
        if (".encoder." in n and p.ndim == 2) or n == "readout.weight"
    )
    assert matmul_params(cfg) == counted


def test_authors_step_is_a_step_and_two_forward_passes_by_the_flop_counter(smoke_profile):
    cfg = smoke_profile.replace(**{"model.attention": "eager"}).model
    model = build_model(cfg, 7, seed=0)
    gen = torch.Generator().manual_seed(0)
    batch, fresh = sample_batch(3, 7, 2, 0.3, gen), sample_batch(2, 7, 2, 0.3, gen)
    with FlopCounterMode(display=False) as counter:
        model(batch.tokens).logits.sum().backward()  # the step
        with torch.no_grad():
            model(batch.tokens)  # the same batch after the update
            model(fresh.tokens)  # the eval batch
    assert counter.get_total_flops() == authors_step_flops(cfg, 7, 3, eval_batch=2)


def test_paper_step_is_about_2_tflop():
    cfg = paper.profile().model
    assert train_step_flops(cfg, 7, 256) == pytest.approx(2.15e12, rel=0.01)
