"""Progress measures and lead times (mclib.analyses.progress): the measures on the smoke run,
the threshold rule and the lead times on synthetic tables whose answer is known."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from mclib.analyses import progress
from mclib.analyses.evaluate import sample_eval_batch
from mclib.core.checkpoints import load_checkpoint, saved_steps
from mclib.core.metrics import losses
from mclib.core.runs import load_metrics

MEASURES = [
    "max_row_excess",
    "max_column_excess",
    "attention_entropy",
    "column_silhouette",
    "token_alignment",
    "grad_attention",
    "grad_mlp",
    "grad_positional",
    "grad_token",
    "grad_other",
    "L_mask",
]


# --- the measures on the smoke run ---------------------------------------------------


@pytest.mark.slow
def test_gradient_norms_cover_every_parameter(smoke_run, smoke_profile):
    g = progress.gradient_norms(smoke_run, smoke_profile.data, n_matrices=16, seed=3)
    steps = saved_steps(smoke_run)
    assert list(g.columns) == ["step", "group", "grad_norm"]
    assert sorted(g["step"].unique()) == steps
    assert set(g["group"]) == set(progress.GROUP_ORDER) | {"total"}
    wide = g.pivot(index="step", columns="group", values="grad_norm")
    assert (wide[list(progress.GROUP_ORDER)] > 0).all().all()
    # the groups partition the gradient: their squares add up to the total
    assert np.allclose((wide[list(progress.GROUP_ORDER)] ** 2).sum(axis=1), wide["total"] ** 2, rtol=1e-9)
    # and the total is the plain gradient norm of L over every trainable parameter
    batch = sample_eval_batch(smoke_profile.data, 16, 3)
    model = load_checkpoint(smoke_run, steps[-1])
    params = [p for p in model.parameters() if p.requires_grad]
    loss = losses(model(batch.tokens).logits.view_as(batch.x), batch.x, batch.mask)["L"]
    total = torch.sqrt(sum((gr.double() ** 2).sum() for gr in torch.autograd.grad(loss, params))).item()
    assert wide.loc[steps[-1], "total"] == pytest.approx(total, rel=1e-6)


@pytest.mark.slow
def test_progress_table_on_the_smoke_run(smoke_run, smoke_profile):
    table = progress.progress_table(smoke_run, smoke_profile.data, n_matrices=16)
    assert list(table.columns) == ["step"] + MEASURES
    assert table["step"].tolist() == saved_steps(smoke_run)
    assert table[MEASURES].notna().all().all()
    assert (table["attention_entropy"] <= math.log(49) + 1e-6).all() and (
        table["attention_entropy"] > 0
    ).all()
    assert table["token_alignment"].iloc[-1] == pytest.approx(1.0)  # the final checkpoint is the reference
    m = load_metrics(smoke_run)
    last = table["step"].iloc[-1]
    assert table["L_mask"].iloc[-1] == pytest.approx(
        m[(m.step > last - 50) & (m.step <= last)]["L_mask"].mean()
    )
    leads = progress.lead_times(table, None)  # the smoke run has no drop
    assert leads["measure"].tolist() == MEASURES and leads["lead_time"].isna().all()


# --- thresholds and lead times on synthetic tables ---------------------------------------

STEPS = np.arange(500, 10_001, 500)  # checkpoints every 500 steps


def _step_up(at, lo=0.0, hi=1.0):
    return np.where(STEPS >= at, hi, lo)


def test_known_crossing_gives_the_known_lead():
    table = pd.DataFrame(
        {
            "step": STEPS,
            "rises": _step_up(3000),
            "falls": _step_up(4000, 5.0, 1.0),
            "L_mask": _step_up(5000, 0.22, 0.01),
        }
    )
    leads = progress.lead_times(table, drop_step=5000).set_index("measure")
    assert leads.loc["rises", "cross_step"] == 3000 and leads.loc["rises", "lead_time"] == 2000
    assert leads.loc["rises", "resolution"] == 500 and leads.loc["rises", "direction"] == "above"
    assert leads.loc["falls", "direction"] == "below" and leads.loc["falls", "threshold"] == pytest.approx(
        3.0
    )
    assert leads.loc["falls", "lead_time"] == 1000
    assert leads.loc["L_mask", "lead_time"] == 0


def test_no_drop_or_no_crossing_gives_nan():
    table = pd.DataFrame({"step": STEPS, "rises": _step_up(3000), "flat": np.ones(len(STEPS))})
    for drop in (None, math.nan):
        leads = progress.lead_times(table, drop).set_index("measure")
        assert leads.loc["rises", "cross_step"] == 3000 and math.isnan(leads.loc["rises", "lead_time"])
    leads = progress.lead_times(table, 5000, thresholds={"rises": (2.0, "above")}).set_index("measure")
    assert math.isnan(leads.loc["rises", "cross_step"]) and math.isnan(leads.loc["rises", "lead_time"])
    assert math.isnan(leads.loc["flat", "threshold"]) and math.isnan(leads.loc["flat", "lead_time"])


def test_explicit_thresholds_and_late_crossings():
    table = pd.DataFrame({"step": STEPS, "ramp": np.linspace(0, 1, len(STEPS))})
    leads = progress.lead_times(table, 4000, thresholds={"ramp": (0.25, "above")}).set_index("measure")
    first = STEPS[np.argmax(np.linspace(0, 1, len(STEPS)) >= 0.25)]
    assert leads.loc["ramp", "cross_step"] == first and leads.loc["ramp", "lead_time"] == 4000 - first
    leads = progress.lead_times(table, 1000).set_index("measure")  # crosses after the drop: negative lead
    assert leads.loc["ramp", "lead_time"] < 0
    with pytest.raises(ValueError, match="nope"):
        progress.lead_times(table, 1000, thresholds={"nope": (1.0, "above")})
    with pytest.raises(ValueError, match="sideways"):
        progress.lead_times(table, 1000, thresholds={"ramp": (0.5, "sideways")})


def test_a_peak_crosses_half_way_up_and_one_spike_does_not_count():
    peak = np.interp(
        STEPS, [500, 4000, 6000, 10_000], [1.0, 1.0, 3.0, 1.2]
    )  # a gradient norm peaking at 6000
    spike = np.zeros(len(STEPS))
    spike[2], spike[12:] = 1.0, 0.9  # one noisy checkpoint at 1500, the real move from 6500
    table = pd.DataFrame({"step": STEPS, "peak": peak, "spike": spike})
    leads = progress.lead_times(table, 6000).set_index("measure")
    assert leads.loc["peak", "threshold"] == pytest.approx(2.0) and leads.loc["peak", "cross_step"] == 5000
    assert leads.loc["spike", "cross_step"] == 6500  # persist = 2 skips the lone spike
    leads = progress.lead_times(table, 6000, persist=1).set_index("measure")
    assert leads.loc["spike", "cross_step"] == 1500
    # a crossing at the very last checkpoint still counts (nothing is left to contradict it)
    late = pd.DataFrame({"step": STEPS, "late": _step_up(10_000)})
    assert progress.lead_times(late, 6000).loc[0, "cross_step"] == 10_000


def test_normalised_runs_from_first_to_extreme():
    table = pd.DataFrame({"step": STEPS, "falls": _step_up(4000, 5.0, 1.0), "flat": np.ones(len(STEPS))})
    norm = progress.normalised(table)
    falls = norm[norm.measure == "falls"]
    assert falls["progress"].iloc[0] == 0 and falls["progress"].iloc[-1] == 1
    assert norm[norm.measure == "flat"]["progress"].isna().all()


def test_the_chapter_figures_have_titles_and_labels():
    import matplotlib

    matplotlib.use("Agg")
    from mclib.book import plots_curves

    table = pd.DataFrame({"step": STEPS, "rises": _step_up(3000), "L_mask": _step_up(5000, 0.22, 0.01)})
    leads = progress.lead_times(table, 5000)
    for drop in (5000, None):
        fig = plots_curves.progress_panels(progress.normalised(table), leads, drop, title="panels")
        assert fig._suptitle.get_text() == "panels" and fig.axes[0].get_ylabel() and fig.axes[0].get_title()
    curves = {
        1: pd.DataFrame({"step": STEPS, "L_mask": table["L_mask"]}),
        2: pd.DataFrame({"step": STEPS, "L_mask": 0.22}),
    }
    fig = plots_curves.seed_loss_curves(curves, {1: 5000, 2: None}, title="seeds")
    ax = fig.axes[0]
    assert ax.get_title() == "seeds" and ax.get_xlabel() and ax.get_ylabel()
    assert [t.get_text() for t in ax.get_legend().get_texts()][:2] == [
        "seed 1: drop at step 5,000",
        "seed 2: no drop",
    ]
    named = plots_curves.seed_loss_curves({"fp32": curves[1], "bf16": curves[2]}, {"fp32": 5000}, label="{}")
    assert [t.get_text() for t in named.axes[0].get_legend().get_texts()][:2] == [
        "fp32: drop at step 5,000",
        "bf16: no drop",
    ]


# --- leads: leaving the plateau's band, for good ------------------------------------------------


def _curves(rng_seed: int = 0):
    """Checkpoints every 250 steps to 10 000, the drop at 8 000: noisy flat plateaus with an
    early-training transient, a single spike, a sustained rise from step 6 000, and the loss."""
    rng = np.random.default_rng(rng_seed)
    steps = np.arange(250, 10_001, 250)
    noise = lambda: rng.normal(0, 0.01, len(steps))
    spike = 1.0 + noise()
    spike[steps == 5000] += 1.0
    return pd.DataFrame(
        {
            "step": steps,
            "early": 1.0 + 5.0 * np.exp(-steps / 400) + noise(),  # big at the start of training, then flat
            "spike": spike,  # one checkpoint far out
            "rises": 1.0
            + np.where(steps >= 6000, (steps - 5750) / 1000, 0)
            + noise(),  # sustained, 2 000 steps early
            "flat": 1.0 + noise(),
            "L_mask": np.where(steps >= 8000, 0.01, 0.11) + 0.001 * noise(),
        }
    )


def test_a_transient_or_a_spike_is_no_lead_and_a_sustained_rise_is():
    leads = progress.plateau_leads(_curves(), 8000).set_index("measure")
    assert np.isnan(leads.loc["early", "lead"]) and np.isnan(leads.loc["spike", "lead"])
    assert np.isnan(leads.loc["flat", "lead"]) and np.isnan(leads.loc["L_mask", "lead"])
    assert leads.loc["rises", "leaves_at"] == 6000 and leads.loc["rises", "lead"] == 2000
    assert (
        leads.loc["rises", "p_lead"] > 0.95
        and leads.loc["rises", "lead_lo"] <= 2000 <= leads.loc["rises", "lead_hi"]
    )
    assert leads.loc["spike", "p_lead"] == 0 and leads.loc["early", "p_lead"] < 0.05
    # the half-way crossing, by contrast, counts both as moves long before the drop
    crossing = progress.lead_times(_curves(), 8000).set_index("measure")
    assert crossing.loc["early", "lead_time"] > 5000


def test_the_spike_becomes_a_lead_only_once_it_lasts():
    table = _curves()
    table.loc[table["step"].between(5000, 5500), "spike"] += 1.0  # three checkpoints out, then back
    leads = progress.plateau_leads(table, 8000).set_index("measure")
    assert leads.loc["spike", "leaves_at"] == 5000
    assert np.isnan(progress.plateau_leads(table, 8000, sustain=4).set_index("measure").loc["spike", "lead"])


def test_no_drop_or_a_short_plateau_gives_no_lead():
    assert progress.plateau_leads(_curves(), None)["lead"].isna().all()
    short = progress.plateau_leads(_curves(), 1000).set_index(
        "measure"
    )  # 1 checkpoint in the baseline window
    assert short["band_low"].isna().all() and short["lead"].isna().all()


def test_plateau_lead_summary_reads_in_every_case():
    leads = progress.plateau_leads(_curves(), 8000)
    text = progress.plateau_lead_summary(leads, 8000, 10_000, 250)
    assert text.startswith(
        "1 measure leaves its plateau band for good before the loss does (the loss itself "
    )
    assert "rises by 2,000 steps (bootstrap 5-95 %:" in text
    quiet = progress.plateau_lead_summary(leads[leads["measure"] != "rises"], 8000, 10_000, 250)
    assert quiet.startswith("No measure leaves its plateau band for good")
    assert progress.plateau_lead_summary(leads, None, 10_000, 250).startswith("There is no drop")


def test_a_loss_without_a_band_is_never_said_to_stay_in_it():
    short = progress.plateau_leads(
        _curves(), 1000
    )  # 1 checkpoint in the baseline window: no band for any measure
    text = progress.plateau_lead_summary(short, 1000, 10_000, 250)
    assert "the loss itself has no band to leave" in text and "stays in its band" not in text
