"""Every figure function returns a Figure with a title, from small made-up data."""
import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from mclib import plots  # noqa: E402


def _title(fig):
    return fig._suptitle.get_text() if fig._suptitle else fig.axes[0].get_title()


def test_copying_figures():
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(4, 7, 7, generator=gen) * 2 - 1
    mask = torch.rand(4, 7, 7, generator=gen) < 0.3
    assert _title(plots.prediction_scatter(x, x * ~mask, mask, title="t")) == "t"
    metrics = pd.DataFrame({"step": range(1, 51), "mask_value": np.linspace(0.5, 0.01, 50)})
    assert _title(plots.mask_value_curve(metrics, 0.35, drop=30, mark={"pre": 10}, title="m")) == "m"
    fig = plots.loss_bars(["a", "b"], {"L_obs": [1e-3, 0.0], "L_mask": [0.2, 0.1]},
                          paper={"L_obs": [2e-3, None]}, title="bars", reference=(0.22, "E[X²]"))
    assert _title(fig) == "bars"


def test_head_figures():
    maps = torch.softmax(torch.randn(2, 3, 49, 49), -1)
    fig = plots.attention_grid(maps, row_labels=["r1", "r2"], col_labels=["a", "b", "c"], title="grid",
                               query_bands=[(21, 27)], key_marks=[22])
    assert _title(fig) == "grid" and len(fig.axes) == 6
    with pytest.raises(ValueError, match="expected \\[rows, cols, query, key\\]"):
        plots.attention_grid(maps[0])
    labels = pd.Series(["row", "column", "identity", "other"],
                       index=pd.MultiIndex.from_tuples([(0, 0), (0, 1), (1, 0), (1, 1)], names=["layer", "head"]))
    assert _title(plots.head_label_heatmap(labels, title="labels")) == "labels"
    progress = pd.DataFrame([{"step": s, "layer": 0, "head": h, "row_excess": s / 10 * h, "column_excess": 0.0,
                              "self_excess": 0.1} for s in (1, 2, 3) for h in (0, 1)])
    assert _title(plots.progress_lines(progress, drop=2, mark={"pre": 1}, title="progress")) == "progress"
    probes = pd.DataFrame([{"layer": l, "target": t, "positions": p, "mse": 0.5, "mse_zero": 1.0,
                            "abs_cos": float("nan") if t == "value" else 0.5}
                           for l in range(3) for t in ("row", "value") for p in ("all", "masked")])
    assert _title(plots.probe_lines(probes, title="probes")) == "probes"
