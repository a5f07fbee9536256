"""The figure functions draw their data: points, lines, bars and images are read back
from the returned Figure and compared with the made-up input."""

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from mclib.chapters import heads_plots as plots_heads  # noqa: E402
from mclib.chapters import scorecard_plots as plots_scorecard


def _title(fig):
    return fig._suptitle.get_text() if fig._suptitle else fig.axes[0].get_title()


def _points(ax) -> np.ndarray:
    return np.concatenate([c.get_offsets() for c in ax.collections])


def test_prediction_scatter_puts_observed_left_and_masked_right():
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(4, 7, 7, generator=gen) * 2 - 1
    mask = torch.rand(4, 7, 7, generator=gen) < 0.3
    pred = x * ~mask  # a copying model: X at observed entries, 0 at masked ones
    fig = plots_heads.prediction_scatter(x, pred, mask, title="t")
    left, right = fig.axes[:2]
    assert _title(fig) == "t"
    obs, hid = _points(left), _points(right)
    assert len(obs) == (~mask).sum() and len(hid) == mask.sum()
    assert np.allclose(obs[:, 0], obs[:, 1])  # on the diagonal
    assert np.allclose(hid[:, 1], 0) and np.allclose(np.sort(hid[:, 0]), np.sort(x[mask].numpy()))


def test_prediction_scatter_samples_at_most_max_points():
    x = torch.zeros(10, 7, 7)
    mask = torch.zeros(10, 7, 7, dtype=torch.bool)
    fig = plots_heads.prediction_scatter(x, x, mask, max_points=100)
    assert len(_points(fig.axes[0])) == 100 and len(_points(fig.axes[1])) == 0


def test_mask_value_curve_draws_the_smoothed_curve_and_the_marks():
    values = np.linspace(0.5, 0.01, 50)
    metrics = pd.DataFrame({"step": range(1, 51), "mask_value": values})
    fig = plots_heads.mask_value_curve(metrics, 0.35, drop=30, mark={"pre": 10}, smooth=1, title="m")
    ax = fig.axes[0]
    curve, reference, drop, pre = ax.get_lines()
    assert np.array_equal(curve.get_xdata(), np.arange(1, 51)) and np.allclose(curve.get_ydata(), values)
    assert list(reference.get_ydata()) == [0.35, 0.35]
    assert list(drop.get_xdata()) == [30, 30] and list(pre.get_xdata()) == [10, 10]
    smoothed = plots_heads.mask_value_curve(metrics, 0.35, smooth=5).axes[0].get_lines()[0].get_ydata()
    assert smoothed[10] == pytest.approx(values[6:11].mean())  # the mean of the 5 steps ending there


def test_loss_bars_draw_one_bar_per_value_on_a_log_scale():
    fig = plots_heads.loss_bars(
        ["a", "b"],
        {"L_obs": [1e-3, 0.0], "L_mask": [0.2, 0.1]},
        paper={"L_obs": [2e-3, None]},
        title="bars",
        reference=(0.22, "E[X²]"),
    )
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and _title(fig) == "bars"
    widths = [p.get_width() for p in ax.patches]
    assert widths[:2] == [1e-3, pytest.approx(np.nan, nan_ok=True)] and widths[2:] == [
        0.2,
        0.1,
    ]  # 0: no bar on a log axis
    diamonds = [l for l in ax.get_lines() if l.get_marker() == "D"]
    assert len(diamonds) == 1 and list(diamonds[0].get_xdata()) == [2e-3]
    assert any(list(l.get_xdata()) == [0.22, 0.22] for l in ax.get_lines())
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]


def test_loss_bars_set_ours_and_the_papers_each_over_its_own_copying_level_with_error_bars():
    # ours on a task with E[X²] = 1/9, the paper's on one with 2/9: the same copying model
    # (L_mask = E[X²]) is 1 on both sides; errors are ± 2 s.e., scaled alike
    fig = plots_heads.loss_bars(
        ["copies", "completes"],
        {"L_mask": [1 / 9, 0.01]},
        errors={"L_mask": [0.01, 0.001]},
        paper={"L_mask": [2 / 9, 0.02]},
        level=1 / 9,
        paper_level=2 / 9,
    )
    ax = fig.axes[0]
    assert [p.get_width() for p in ax.patches] == pytest.approx([1.0, 0.09])
    diamonds = [l for l in ax.get_lines() if l.get_marker() == "D"]
    assert [l.get_xdata()[0] for l in diamonds] == pytest.approx([1.0, 0.09])
    assert any(list(l.get_xdata()) == [1, 1] for l in ax.get_lines())  # the copying line at 1
    caps = [seg for c in ax.collections for seg in c.get_segments()]  # the error bars' segments
    spans = sorted(abs(seg[1][0] - seg[0][0]) for seg in caps)
    assert spans == pytest.approx(sorted([4 * 0.01 * 9, 4 * 0.001 * 9]))
    # a level per label (E2: low-rank and random matrices have their own E[X²])
    fig = plots_heads.loss_bars(
        ["a", "b"], {"q": [0.1, 0.3]}, paper={"q": [0.2, 0.3]}, level=[0.1, 0.3], paper_level=[0.2, 0.3]
    )
    assert [p.get_width() for p in fig.axes[0].patches] == pytest.approx([1.0, 1.0])
    assert "no error computed" in fig.axes[0].get_legend().get_texts()[0].get_text()
    matplotlib.pyplot.close("all")


def test_scorecard_plot_gives_the_data_half_the_width_at_any_number_of_rows():
    row = lambda i, verdict: {
        "id": f"E{i // 3}",
        "quantity": "a long quantity name " * 4,
        "kind": "number",
        "paper": 0.2,
        "ours": 0.2 * (1 + i / 10),
        "se": 0.01,
        "verdict": verdict,
    }
    for n in (3, 80):
        fig = plots_scorecard.scorecard_plot([row(i, "matches" if i % 2 else "differs") for i in range(n)])
        ax = fig.axes[0]
        box = ax.get_position()
        w, h = fig.get_size_inches()
        assert box.width * w > 5 and box.height * h / n > 0.25  # inches of data per figure, per row
        assert len(ax.get_yticklabels()) == n and all("\n" in t.get_text() for t in ax.get_yticklabels())
        assert len([c for c in ax.containers]) == n  # one error bar per row
        matplotlib.pyplot.close(fig)


def test_attention_grid_shows_each_map():
    maps = torch.softmax(torch.randn(2, 3, 49, 49, generator=torch.Generator().manual_seed(0)), -1)
    fig = plots_heads.attention_grid(
        maps,
        row_labels=["r1", "r2"],
        col_labels=["a", "b", "c"],
        title="grid",
        query_bands=[(21, 27)],
        key_marks=[22],
    )
    assert _title(fig) == "grid" and len(fig.axes) == 7  # six maps and a colour bar
    for i, ax in enumerate(fig.axes[:6]):
        (image,) = ax.get_images()
        assert np.allclose(image.get_array(), maps[i // 3, i % 3].numpy())
        assert image.get_clim() == (0, pytest.approx(max(maps.max().item(), 3 / 49)))  # one scale for all
    assert fig.axes[6].get_ylabel() == "attention probability"
    assert [ax.get_title() for ax in fig.axes[:3]] == ["a", "b", "c"] and fig.axes[3].get_ylabel() == "r2"
    uniform = plots_heads.attention_grid(torch.full((1, 1, 49, 49), 1 / 49))
    assert uniform.axes[0].get_images()[0].get_clim() == (0, pytest.approx(3 / 49))  # a flat head stays dark
    with pytest.raises(ValueError, match="expected \\[rows, cols, query, key\\]"):
        plots_heads.attention_grid(maps[0])


def test_head_label_heatmap_colours_each_head_by_its_label():
    labels = pd.Series(
        ["row", "column", "identity", "other"],
        index=pd.MultiIndex.from_tuples([(0, 0), (0, 1), (1, 0), (1, 1)], names=["layer", "head"]),
    )
    fig = plots_heads.head_label_heatmap(labels, title="labels")
    ax = fig.axes[0]
    names = list(plots_heads.LABEL_COLORS)
    grid = ax.get_images()[0].get_array()
    assert grid.tolist() == [
        [names.index("row"), names.index("column")],
        [names.index("identity"), names.index("other")],
    ]
    assert [t.get_text() for t in ax.texts] == ["row", "col", "ide", "oth"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2"]  # 1-indexed, as in the paper


def test_progress_lines_draw_every_head_and_the_largest():
    progress = pd.DataFrame(
        [
            {
                "step": s,
                "layer": 0,
                "head": h,
                "row_excess": s / 10 * h,
                "column_excess": 0.0,
                "self_excess": 0.1,
            }
            for s in (1, 2, 3)
            for h in (0, 1)
        ]
    )
    fig = plots_heads.progress_lines(progress, drop=2, mark={"pre": 1}, title="progress")
    row_ax = fig.axes[0]
    lines = row_ax.get_lines()
    assert np.allclose(lines[0].get_ydata(), [0, 0, 0]) and np.allclose(lines[1].get_ydata(), [0.1, 0.2, 0.3])
    assert np.allclose(lines[2].get_ydata(), [0.1, 0.2, 0.3])  # the largest over heads is head 1
    assert any(list(l.get_xdata()) == [2, 2] for l in lines)  # the drop


def test_probe_lines_plot_mse_relative_to_zero():
    probes = pd.DataFrame(
        [
            {
                "layer": l,
                "target": t,
                "positions": p,
                "mse": 0.1 * (l + 1),
                "mse_zero": 1.0,
                "abs_cos": float("nan") if t == "value" else 0.5,
            }
            for l in range(3)
            for t in ("row", "value")
            for p in ("all", "masked")
        ]
    )
    fig = plots_heads.probe_lines(probes, title="probes")
    assert _title(fig) == "probes" and len(fig.axes) == 4
    mse_row = fig.axes[0].get_lines()
    assert len(mse_row) == 2 and np.allclose(mse_row[0].get_ydata(), [0.1, 0.2, 0.3])
    assert any("no cosine" in t.get_text() for t in fig.axes[3].texts)  # the value target has no cosine


def test_the_theme_is_set_in_one_place_and_a_heatmap_leaves_it_as_it_was():
    """The book's plot theme is set once, in mclib/book/plots_base.py; the gridless maps draw
    without a grid and leave the theme's grid on for the next figure."""
    import re
    from pathlib import Path

    import matplotlib.pyplot as plt

    import mclib

    root = Path(mclib.__file__).parents[1]
    setters = re.compile(r"sns\.set_theme|sns\.set\(|sns\.set_style|plt\.style\.use")
    calls = [
        f"{p.relative_to(root)}:{i}"
        for p in sorted([*root.glob("mclib/**/*.py"), *root.glob("scripts/*.py"), *root.glob("book/*.ipynb")])
        for i, l in enumerate(p.read_text().splitlines(), 1)
        if setters.search(l)
    ]
    assert [c.rsplit(":", 1)[0] for c in calls] == ["mclib/book/plots_base.py"], calls  # one call, there
    assert plt.rcParams["axes.grid"]  # the theme: whitegrid
    grid = plots_heads.attention_grid(torch.full((1, 1, 9, 9), 1 / 9), n=3)
    assert not grid.axes[0].xaxis._major_tick_kw.get("gridOn", False)  # the map has no grid
    assert plt.rcParams["axes.grid"]  # and the theme is back
    plt.close(grid)
