import pytest
import torch
from conftest import TWO_PATHS

from mclib.analyses.probes import (
    POSITIONS,
    TARGETS,
    ProbeSet,
    fit_probe,
    probe_layers,
    probe_sets,
    probe_target,
)
from mclib.core.checkpoints import load_checkpoint
from mclib.core.config import DataConfig, ModelConfig
from mclib.core.data import sample_batch
from mclib.core.model import build_model

N = 7


def test_targets_follow_the_reading_of_e11(gen):
    b = sample_batch(4, N, 2, 0.3, gen)
    row = probe_target(b.x, b.mask, "row")
    assert row.shape == (4, N * N, N)
    p = 2 * N + 3  # position (2, 3): the input's row 2, masked entries 0
    assert torch.equal(row[1, p], torch.where(b.mask[1, 2], 0.0, b.x[1, 2]))
    assert torch.equal(probe_target(b.x, b.mask, "value")[:, :, 0], b.x.flatten(1))
    u = probe_target(b.x, b.mask, "singular")
    assert torch.allclose(u.norm(dim=-1), torch.ones(4, N * N))
    assert torch.equal(u[:, 0], u[:, -1])  # the same vector at every position
    top = u[:, 0].abs().argmax(-1, keepdim=True)
    assert (u[:, 0].gather(-1, top) > 0).all()  # canonical sign
    ref = torch.linalg.svd(b.x.double())[0][..., 0].float()
    assert torch.allclose(u[:, 0].abs(), ref.abs(), atol=1e-6)  # |u₁| as torch's SVD
    with pytest.raises(ValueError, match="'column'"):
        probe_target(b.x, b.mask, "column")


def test_probe_recovers_a_planted_linear_map(gen):
    h = torch.randn(500, 16, generator=gen)
    w = torch.randn(16, 3, generator=gen)
    assert torch.allclose(fit_probe(h, h @ w), w.double(), atol=1e-10)


def test_the_gpu_method_fits_a_rank_deficient_probe_as_lapack_does(gen):
    """fit_probe's "pinv" (what a GPU runs) and "gelsd" (the CPU's) on h with dead dimensions:
    the same minimum-norm W; an unknown method is named."""
    h = torch.randn(400, 12, generator=gen)
    h[:, 3] = 0.0  # a dead dimension
    h[:, 7] = 2.0 * h[:, 1]  # a copied one
    y = h @ torch.randn(12, 2, generator=gen) + 0.01 * torch.randn(400, 2, generator=gen)
    gelsd, pinv = fit_probe(h, y, "gelsd"), fit_probe(h, y, "pinv")
    assert torch.allclose(gelsd, pinv, atol=1e-9)  # two float64 solvers: 1e-15 apart here, far below 1e-9
    assert gelsd[3].abs().max() < 1e-12  # minimum norm: nothing on the dead dimension
    with pytest.raises(ValueError, match="'qr'"):
        fit_probe(h, y, "qr")


def _planted_sets(gen, batch):
    """Layer 0: a random linear image of every target (exactly probe-able); layer 1: noise."""
    b = sample_batch(batch, N, 2, 0.3, gen)
    feats = torch.cat([probe_target(b.x, b.mask, t) for t in TARGETS], -1)  # [batch, seq, 15]
    mix = torch.randn(feats.shape[-1], 24, generator=torch.Generator().manual_seed(1))
    noise = torch.randn(batch, N * N, 24, generator=gen)
    return ProbeSet((feats @ mix, noise), b.x, b.mask)


def test_planted_layer_is_exact_and_noise_layer_is_not(gen):
    fit, test = _planted_sets(gen, 64), _planted_sets(gen, 16)
    df = probe_layers(fit, test)
    assert len(df) == 2 * len(TARGETS) * len(POSITIONS)
    planted, noise = df[df.layer == 0], df[df.layer == 1]
    assert (planted["mse"] < 1e-12).all()
    assert planted.loc[planted.target != "value", "abs_cos"].to_numpy() == pytest.approx(1)
    assert planted.loc[planted.target == "value", "abs_cos"].isna().all()  # no cosine for a scalar
    # noise: no better than predicting 0 (a little worse: the probe fits noise)
    assert (noise["mse"] > 0.9 * noise["mse_zero"]).all()
    assert (noise.loc[noise.target != "value", "abs_cos"] < 0.9).all()
    counts = df[(df.layer == 0) & (df.target == "value")].set_index("positions")["n_test"]
    assert counts["masked"] == int(test.mask.sum()) and counts["masked"] + counts["observed"] == counts["all"]


def test_fit_on_masked_positions_only(gen):
    fit, test = _planted_sets(gen, 32), _planted_sets(gen, 8)
    df = probe_layers(fit, test, targets=("value",), positions=("masked",), fit_on="masked")
    assert df["n_fit"].iloc[0] == int(fit.mask.sum())


def test_bad_inputs_name_the_value(gen):
    b = sample_batch(4, N, 2, 0.3, gen)
    with pytest.raises(ValueError, match="n = 7"):
        ProbeSet((torch.zeros(4, 36, 8),), b.x, b.mask)
    with pytest.raises(ValueError, match="layer 1"):
        ProbeSet((torch.zeros(4, 49, 8), torch.zeros(3, 49, 8)), b.x, b.mask)
    s = ProbeSet((torch.zeros(4, 49, 8),), b.x, b.mask)
    with pytest.raises(ValueError, match="'middle'"):
        probe_layers(s, s, positions=("middle",))
    with pytest.raises(ValueError, match="data n = 5"):
        probe_sets(
            build_model(ModelConfig(layers=1, heads=2, hidden=8, intermediate=16), N, seed=0), DataConfig(n=5)
        )


def test_probe_sets_from_a_checkpoint(smoke_run, smoke_profile):
    model = load_checkpoint(smoke_run, smoke_profile.checkpoints.post)
    fit, test = probe_sets(model, smoke_profile.data, n_fit=48, n_test=16, seed=3, chunk=20)
    assert len(fit.hidden) == smoke_profile.model.layers + 1  # embeddings + each layer
    assert fit.hidden[0].shape == (48, N * N, smoke_profile.model.hidden) and test.x.shape == (16, N, N)
    again, _ = probe_sets(model, smoke_profile.data, n_fit=48, n_test=16, seed=3)
    assert torch.equal(again.x, fit.x)
    torch.testing.assert_close(
        again.hidden[-1], fit.hidden[-1], **TWO_PATHS
    )  # chunks of 20 vs one batch (conftest)
    assert not torch.equal(fit.x[:16], test.x)  # test matrices are fresh
    df = probe_layers(fit, test)
    assert len(df) == (smoke_profile.model.layers + 1) * len(TARGETS) * len(POSITIONS)
    assert df["mse"].notna().all()
