"""The follow-up's plateau measures (mclib.analyses.plateau) on models whose answer is known
by construction."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

from mclib.analyses.evaluate import sample_eval_batch
from mclib.analyses.heads import capture_probs, head_scores
from mclib.analyses.plateau import (
    attention_share,
    masked_spread,
    plateau_measures,
    plateau_table,
    representation_collapse,
)
from mclib.core.checkpoints import saved_steps
from mclib.core.data import sample_batch
from mclib.core.model import MatrixCompletionOutput, build_model
from mclib.core.runs import checkpoint_dir


def _batch(n=5, batch=32, seed=0):
    return sample_batch(batch, n, 1, 0.3, torch.Generator().manual_seed(seed))


class Stub(nn.Module):
    """hidden_states and outputs made to order from the batch (through the tokens' mask)."""

    def __init__(self, hidden=None, output=None):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self._hidden, self._output = hidden, output

    def hidden_states(self, tokens):
        return self._hidden(tokens)

    def forward(self, tokens):
        return MatrixCompletionOutput(logits=self._output(tokens))


def test_collapse_is_one_when_masked_entries_share_a_direction_and_zero_when_orthogonal():
    b = _batch()
    seq, g = b.tokens.shape[1], torch.Generator().manual_seed(1)

    def hidden(tokens):
        masked = (tokens == 0)[..., None]  # MASK_ID is 0
        noise = torch.randn(*tokens.shape, seq, generator=g)  # observed entries: anything
        same = torch.where(masked, torch.full_like(noise, 0.3) * 2, noise)
        eye = torch.eye(seq).expand(tokens.shape[0], seq, seq)  # entry p along axis p
        orth = torch.where(masked, eye * 5, noise)
        return same, orth

    t = representation_collapse(Stub(hidden=hidden), b)
    assert t["layer"].tolist() == [0, 1]
    assert t["cosine"][0] == pytest.approx(1.0, abs=1e-12) and t["cosine"][1] == pytest.approx(0.0, abs=1e-12)
    assert t["matrices"][0] == int(((b.mask.flatten(1).sum(1)) >= 2).sum())


def test_collapse_of_a_real_model_has_one_row_per_hidden_state(smoke_profile):
    p = smoke_profile
    model = build_model(p.model, p.data.n, 1)
    t = representation_collapse(model, _batch(p.data.n, 16))
    assert len(t) == p.model.layers + 1 and t["cosine"].between(-1, 1).all() and (t["se"] > 0).all()


def test_spread_ratio_is_one_for_the_truth_zero_for_one_value_and_scales_with_the_outputs():
    b = _batch(batch=64)
    x = b.x.flatten(1)
    truth = masked_spread(Stub(output=lambda tokens: x), b)
    assert truth["spread_ratio"] == pytest.approx(1.0, abs=1e-12) and truth["se"] == pytest.approx(
        0.0, abs=1e-12
    )
    const = masked_spread(Stub(output=lambda tokens: torch.full_like(x, 0.7)), b)
    assert const["spread_ratio"] == pytest.approx(0.0, abs=1e-12)
    half = masked_spread(Stub(output=lambda tokens: 0.5 * x + 3.0), b)
    assert half["spread_ratio"] == pytest.approx(0.5, abs=1e-6)  # float32 outputs
    jitter = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    noisy = masked_spread(Stub(output=lambda tokens: x + jitter), b)
    assert noisy["spread_ratio"] > 1 and noisy["se"] > 0


@pytest.mark.parametrize("target, want", [("row_col", 1.0), ("other", 0.0)])
def test_attention_share_follows_a_forced_bias(smoke_profile, target, want):
    p = smoke_profile.replace(**{"model.attn_bias": 60.0, "model.attn_bias_target": target})
    t = attention_share(build_model(p.model, p.data.n, 1), _batch(p.data.n, 8))
    assert t["share"].tolist() == pytest.approx([want] * p.model.layers, abs=1e-6)


def test_attention_share_of_uniform_heads_is_chance(smoke_profile):
    p = smoke_profile
    model = build_model(p.model, p.data.n, 1)
    with torch.no_grad():
        for layer in model.bert.encoder.layer:
            layer.attention.self.query.weight.zero_()
            layer.attention.self.query.bias.zero_()
    t = attention_share(model, _batch(p.data.n, 8))
    n = p.data.n
    assert t["share"].tolist() == pytest.approx(
        [2 * (n - 1) / n**2] * p.model.layers, abs=1e-6
    )  # float32 softmax
    assert (t["chance"] == 2 * (n - 1) / n**2).all()


def test_attention_share_is_chapter_03s_row_plus_column_mass(smoke_profile):
    p = smoke_profile
    model = build_model(p.model, p.data.n, 2)
    b = _batch(p.data.n, 16)
    scores = head_scores(capture_probs(model, b), b.mask, b.n)
    want = (scores["row"] + scores["column"]).groupby(scores["layer"]).mean()
    got = attention_share(model, b).set_index("layer")["share"]
    assert got.tolist() == pytest.approx(want.tolist(), abs=1e-12)


def test_plateau_table_skips_a_checkpoint_without_a_model_and_names_it(
    tmp_path, smoke_run, smoke_profile, logged
):
    run = tmp_path / "run"
    shutil.copytree(smoke_run, run)
    steps = saved_steps(run)
    gone = steps[1]
    (checkpoint_dir(run, gone) / "model.safetensors").unlink()
    t = plateau_table(run, smoke_profile.data, n_matrices=8, steps=steps)
    assert t["step"].tolist() == [s for s in steps if s != gone] and t.attrs["skipped"] == [gone]
    err = logged.err()
    assert f"step {gone} skipped" in err
    row = plateau_measures(
        build_model(smoke_profile.model, smoke_profile.data.n, 1), sample_eval_batch(smoke_profile.data, 8, 0)
    )
    assert set(t.columns) == {"step", *row}


def test_measure_sweep_measures_each_finished_run_once(tmp_path):
    import textwrap

    import pandas as pd

    from mclib.analyses.plateau import measure_sweep
    from mclib.core.sweep import append_row, load_sweep
    from mclib.core.sweep_run import summarise
    from mclib.core.train import train

    sweep = tmp_path / "bias.yaml"
    sweep.write_text(
        textwrap.dedent("""\
        base: smoke
        seeds: [1]
        settings:
          - {name: bias0, overrides: {}}
          - {name: rowcol-2, overrides: {model.attn_bias: 2.0}}
    """)
    )
    runs, results, out = tmp_path / "runs", tmp_path / "bias.csv", tmp_path / "measures.csv"
    todo = load_sweep(sweep, runs)
    for run in todo:
        train(run.profile, run.run_dir, progress=False)
    assert measure_sweep(sweep, results, out, runs, n_matrices=8) == 0 and not out.exists()  # no row yet
    append_row(results, summarise(todo[1]))
    assert measure_sweep(sweep, results, out, runs, n_matrices=8) == 1
    t = pd.read_csv(out)
    assert set(t["setting"]) == {"rowcol-2"} and (t["attn_bias"] == 2.0).all()
    assert t["step"].tolist() == saved_steps(todo[1].run_dir) and t["share_L0"].notna().all()
    append_row(results, summarise(todo[0]))
    assert measure_sweep(sweep, results, out, runs, n_matrices=8) == 1
    assert measure_sweep(sweep, results, out, runs, n_matrices=8) == 0
    t = pd.read_csv(out)
    assert t.groupby("setting").size().to_dict() == {
        s: len(saved_steps(r.run_dir)) for s, r in zip(("bias0", "rowcol-2"), todo)
    }
    # the bias shows in the measure it acts on: more mass on row and column keys at every checkpoint
    first = t.groupby("setting")["share_L0"].mean()
    assert first["rowcol-2"] > first["bias0"] + 0.1
