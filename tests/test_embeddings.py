import numpy as np
import pytest

from mclib.config import ModelConfig
from mclib.embeddings import (alignment, captured_variance, component_tracks, embedding_progress, fit_pca,
                              norm_symmetry, position_norms, position_rows, position_silhouette,
                              position_tsne, project, token_ids, token_norms, token_projections, token_rows,
                              token_values)
from mclib.model import build_model
from mclib.train import saved_steps

N = 7


@pytest.fixture(scope="module")
def model():
    return build_model(ModelConfig(layers=1, heads=2, hidden=16, intermediate=32), N, seed=0)


def test_token_helpers_pick_ids_851_to_1151(model):
    ids = token_ids()
    assert ids.tolist() == list(range(851, 1152))
    assert token_values()[[0, 150, -1]].tolist() == [-1.5, 0.0, 1.5]
    rows = token_rows(model)
    table = model.bert.embeddings.word_embeddings.weight.detach()
    assert rows.shape == (301, 16) and np.allclose(rows[0], table[851].numpy()) and np.allclose(rows[-1], table[1151].numpy())
    df = token_norms(model)
    assert list(df.columns) == ["value", "id", "norm"] and df["id"].iloc[150] == 1001


def _value_rows(rng, noise=0.01):
    """Rows built from |x| along one direction and sign(x) along another: E12's picture."""
    x = token_values()
    a, b = rng.normal(size=(2, 32))
    return x, np.abs(x)[:, None] * a + np.sign(x)[:, None] * b + noise * rng.normal(size=(len(x), 32))


def test_pca_projection_alignment_and_tracks():
    rng = np.random.default_rng(0)
    x, rows = _value_rows(rng)
    pca = fit_pca(rows)
    assert np.allclose(project(rows, pca), rows @ pca.components_.T)            # the authors: no centring
    assert np.allclose(project(rows + 5.0, pca, centred=True), project(rows, pca, centred=True))
    final = project(rows, pca, centred=True)
    assert alignment(final, final) == pytest.approx(1)
    assert alignment(3 * final, final) == pytest.approx(1)                       # scale-free
    assert abs(alignment(project(rng.normal(size=rows.shape), pca, True), final)) < 0.3
    assert captured_variance(rows, pca) == pytest.approx(pca.explained_variance_ratio_.sum())
    tracks = component_tracks(final, x).set_index("component")
    assert max(tracks["abs_x"]) > 0.9 and max(tracks["sign_x"]) > 0.9
    assert norm_symmetry(x, np.linalg.norm(rows, axis=1)) > 0.99                # |x| and sign²: symmetric


def _column_clustered(rng, noise=0.05):
    centres = rng.normal(size=(N, 32))
    return centres[np.arange(N * N) % N] + noise * rng.normal(size=(N * N, 32))


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_silhouette_high_for_columns_and_zero_for_random(metric):
    rng = np.random.default_rng(0)
    clustered = _column_clustered(rng)
    assert position_silhouette(clustered, N, "column", metric) > 0.8
    assert position_silhouette(clustered, N, "row", metric) < 0
    noise = rng.normal(size=(N * N, 32))
    assert abs(position_silhouette(noise, N, "column", metric)) < 0.1
    assert abs(position_silhouette(noise, N, "row", metric)) < 0.1


def test_tsne_is_seeded_and_keeps_columns_apart():
    rows = _column_clustered(np.random.default_rng(1))
    a, b = position_tsne(rows, N, seed=0), position_tsne(rows, N, seed=0)
    assert list(a.columns) == ["position", "row", "column", "x", "y"] and len(a) == N * N
    assert np.allclose(a[["x", "y"]], b[["x", "y"]])
    assert position_silhouette(a[["x", "y"]].to_numpy(), N, "column", "euclidean") > 0.5


def test_position_rows_and_norms(model):
    rows = position_rows(model)
    assert rows.shape == (N * N, 16)
    df = position_norms(rows, N)
    assert df["column"].tolist()[:8] == [0, 1, 2, 3, 4, 5, 6, 0] and df["row"].iloc[-1] == N - 1


def test_bad_inputs_name_the_value(model):
    rows = position_rows(model)
    with pytest.raises(ValueError, match="n = 6"):
        position_silhouette(rows, 6)
    with pytest.raises(ValueError, match="n = 8"):
        position_rows(model, 8)
    with pytest.raises(ValueError, match="'diagonal'"):
        position_silhouette(rows, N, by="diagonal")
    with pytest.raises(ValueError, match="hidden size 8"):
        project(np.zeros((301, 8)), fit_pca(token_rows(model)))


def test_progress_has_one_row_per_saved_step(smoke_run):
    df = embedding_progress(smoke_run)
    assert df["step"].tolist() == saved_steps(smoke_run)
    last = df.iloc[-1]
    assert last["token_alignment"] == pytest.approx(1)
    assert df[["column_silhouette", "row_silhouette"]].abs().le(1).all().all()
    with pytest.raises(ValueError, match="final_step 7"):
        embedding_progress(smoke_run, final_step=7)


def test_token_projections_at_chosen_steps(smoke_run):
    steps = saved_steps(smoke_run)
    coords, summary = token_projections(smoke_run, steps[:2] + steps[-1:])
    assert summary["step"].tolist() == steps[:2] + steps[-1:] and len(coords) == 3 * 2 * 301
    last = summary.iloc[-1]
    assert last["alignment_uncentred"] == pytest.approx(1) and last["alignment_centred"] == pytest.approx(1)
    assert summary["captured"].between(0, 1).all()
    final = coords[(coords.step == steps[-1]) & coords.centred]
    assert final[["pc1", "pc2"]].mean().abs().max() < 1e-9          # centred coordinates have mean 0
    with pytest.raises(ValueError, match=r"\[7\]"):
        token_projections(smoke_run, [7])
    init = build_model(ModelConfig(layers=2, heads=2, hidden=16, intermediate=32), N, seed=1)  # the smoke init
    coords, summary = token_projections(smoke_run, steps[-1:], initial=init)
    assert summary["step"].tolist() == [0, steps[-1]] and summary["alignment_centred"].iloc[0] < 1
