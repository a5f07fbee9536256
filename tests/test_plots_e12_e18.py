"""The figures of the embeddings, freezing and baselines chapters (E12-E18): each returns
a Figure with a title and labelled axes, from small made-up data."""

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from mclib.book import plots_curves
from mclib.chapters import baselines_plots as plots_baselines  # noqa: E402
from mclib.chapters import embeddings_plots as plots_embeddings

N = 7


def _title(fig):
    return fig._suptitle.get_text() if fig._suptitle else fig.axes[0].get_title()


def _labelled(fig):
    axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    return all(ax.get_xlabel() for ax in axes) and any(ax.get_ylabel() for ax in axes)


def test_embedding_figures():
    values = np.linspace(-1.5, 1.5, 31)
    norms = pd.DataFrame({"value": values, "norm": np.abs(values) + 1})
    coords = pd.DataFrame({"value": values, "pc1": np.abs(values), "pc2": np.sign(values)})
    for fig, title in [(plots_embeddings.token_embedding_plot(norms, coords, title="tokens"), "tokens")]:
        assert _title(fig) == title and _labelled(fig)
    long = pd.concat([coords.assign(step=s, centred=c) for s in (0, 10) for c in (False, True)])
    fig = plots_embeddings.token_progress_plot(long, {0: "init"}, title="progress")
    assert _title(fig) == "progress" and _labelled(fig) and fig.axes[0].get_title() == "init"
    pos = np.arange(N * N)
    frame = pd.DataFrame({"position": pos, "row": pos // N, "column": pos % N, "x": pos % N, "y": pos // N})
    fig = plots_embeddings.position_tsne_plot({"a": frame, "b": frame}, title="tsne")
    assert _title(fig) == "tsne" and _labelled(fig)
    fig = plots_embeddings.position_norm_plot(frame.assign(norm=1.0), title="norms")
    assert _title(fig) == "norms" and _labelled(fig)
    progress = pd.DataFrame(
        {
            "step": [10, 20, 30],
            "column_silhouette": [0, 0.2, 0.5],
            "row_silhouette": [0, 0, 0.1],
            "token_alignment": [0.3, 0.9, 1.0],
        }
    )
    for drop, init in [(None, None), (20, 0.4)]:
        fig = plots_embeddings.embedding_progress_plot(progress, drop, init, title="emb")
        assert _title(fig) == "emb" and _labelled(fig)


def test_freeze_and_baseline_figures():
    m = pd.DataFrame({"step": range(1, 101), "L_mask": np.linspace(0.22, 0.01, 100)})
    fig = plots_curves.freeze_curves(
        {"mlp": m, "positional": m.assign(L_mask=0.22)}, {"mlp": 60, "positional": None}, title="freeze"
    )
    assert (
        _title(fig) == "freeze"
        and _labelled(fig)
        and "no drop" in fig.axes[0].get_legend_handles_labels()[1][1]
    )
    rows = [
        {"p_mask": p, "method": k, "L": 0.01 * p, "L_se": 1e-3, "nuclear": 4.0, "nuclear_se": 0.1}
        for p in (0.2, 0.3)
        for k in ("BERT", "nuclear norm", "truth")
    ]
    fig = plots_baselines.nuclear_comparison_plot(pd.DataFrame(rows), 0.3, title="nuclear")
    assert _title(fig) == "nuclear" and _labelled(fig)
    ood = pd.DataFrame(
        [
            {"dist": d, "method": k, "L_mask_rel": 0.1, "L_mask_se": 1e-3, "copy_level": 0.2}
            for d in ("uniform", "gaussian")
            for k in ("BERT", "nuclear norm")
        ]
    )
    fig = plots_baselines.ood_plot(ood, title="ood")
    assert _title(fig) == "ood" and _labelled(fig)
    fig = plots_baselines.per_matrix_plot(
        {"BERT": np.array([1e-3, 1e-2]), "ALS": np.array([0.0, 1.0])}, title="per"
    )
    assert _title(fig) == "per" and _labelled(fig)
